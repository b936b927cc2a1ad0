//! The deploy/ tree checked offline by `deploy/check`: both Kubernetes overlays render and
//! validate, YAML lints, the Dockerfile lints, dashboards are JSON whose queries name only metrics
//! Tidings exports. And the check has teeth: deliberately broken copies fail it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;
use tidings_bus::permissions::{Service, server_config};
use tidings_runtime::flags::parsed_defaults;
use tidings_tests::brokers::{NatsCluster, free_port};
use tidings_tests::fake_catalog::FakeCatalog;
use tidings_tests::harness::{
    DB_LOGINS, TestDb, assert_generated, login_url, poll_wait, stack, tool,
};
use tidings_tests::manifests::{Local, Overlay, localize, mount_secrets};
use tidings_tests::services::binary;

fn fixture(path: &str) -> String {
    std::fs::read_to_string(repo().join("tests/fixtures").join(path)).unwrap()
}

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The exported sample names, from the registry's own list (checked against the registry by
/// a unit test in tidings-runtime).
fn names_file(dir: &Path) -> PathBuf {
    let path = dir.join("metric-names.txt");
    std::fs::write(&path, tidings_runtime::metrics::sample_names().join("\n")).unwrap();
    path
}

/// Runs deploy/check on `root`; returns (success, output).
fn check(root: &Path) -> (bool, String) {
    let scratch = tempdir();
    let tools = tool("python").unwrap();
    let out = Command::new("bash")
        .arg(repo().join("deploy/check"))
        .arg(root)
        .env("TIDINGS_TOOLS_BIN", tools.parent().unwrap())
        .env("TIDINGS_METRIC_NAMES", names_file(&scratch))
        .output()
        .expect("run deploy/check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&scratch);
    (out.status.success(), text)
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tidings-deploy-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A copy of what deploy/check reads: deploy/, the Dockerfile, .yamllint.yaml.
fn copy() -> PathBuf {
    let dir = tempdir();
    let status = Command::new("cp")
        .arg("-r")
        .arg(repo().join("deploy"))
        .arg(repo().join("Dockerfile"))
        .arg(repo().join(".yamllint.yaml"))
        .arg(&dir)
        .status()
        .unwrap();
    assert!(status.success());
    dir
}

fn edit(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(from), "{} has no {from:?}", file.display());
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
}

#[test]
fn the_manifests_dashboards_and_dockerfile_pass_the_checks() {
    let (ok, out) = check(&repo());
    assert!(ok, "{out}");
    for expected in [
        "overlay dev: renders, valid for Kubernetes",
        "overlay prod: renders, valid for Kubernetes",
        "and its 4 prometheus-operator and KEDA resources valid",
        "yamllint: clean",
        "hadolint: Dockerfile clean",
        "dashboards and alerts: valid, every metric exported",
    ] {
        assert!(out.contains(expected), "{expected:?} missing from:\n{out}");
    }
}

#[test]
fn an_invalid_manifest_fails_the_checks() {
    let dir = copy();
    edit(
        &dir.join("deploy/k8s/base/api.yaml"),
        "containerPort: 8080",
        "containerPort: \"eighty\"",
    );
    let (ok, out) = check(&dir);
    assert!(!ok, "{out}");
    assert!(
        out.contains("deployment/api") && out.contains("containerPort"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_invalid_service_monitor_fails_the_checks() {
    let dir = copy();
    edit(
        &dir.join("deploy/k8s/components/prometheus-operator/servicemonitor.yaml"),
        "interval: 15s",
        "interval: 15",
    );
    let (ok, out) = check(&dir);
    assert!(!ok, "{out}");
    assert!(
        out.contains("a prometheus-operator or KEDA resource is not valid")
            && out.contains("ServiceMonitor/tidings")
            && out.contains("interval"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_invalid_scaled_object_fails_the_checks() {
    let dir = copy();
    edit(
        &dir.join("deploy/k8s/components/keda/scaledobjects.yaml"),
        "  minReplicaCount: 2\n  maxReplicaCount: 10\n  pollingInterval: 15\n  cooldownPeriod: 300\n  triggers:\n    - type: nats-jetstream\n      metadata:\n        natsServerMonitoringEndpoint: \"nats.nats.svc:8222\"\n        account: \"$G\"\n        stream: tidings_enqueue",
        "  minReplicaCount: 2\n  maxReplicaCount: 10\n  pollingInterval: 15\n  cooldownPeriod: 300\n  triggers:\n    - type: nats-jetstream\n      metadata:\n        natsServerMonitoringEndpoint: \"nats.nats.svc:8222\"\n        account: \"$G\"\n        stream: [tidings_enqueue]",
    );
    let (ok, out) = check(&dir);
    assert!(!ok, "{out}");
    assert!(
        out.contains("a prometheus-operator or KEDA resource is not valid")
            && out.contains("ScaledObject/dispatcher"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_overlay_that_does_not_render_fails_the_checks() {
    let dir = copy();
    edit(
        &dir.join("deploy/k8s/overlays/prod/kustomization.yaml"),
        "  - ../../base",
        "  - ../../base\n  - missing.yaml",
    );
    let (ok, out) = check(&dir);
    assert!(!ok, "{out}");
    assert!(out.contains("overlay prod does not render"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_dashboard_query_on_an_unknown_metric_fails_the_checks() {
    let dir = copy();
    edit(
        &dir.join("deploy/grafana/dashboards/pipeline-overview.json"),
        "max by (status) (tidings_outbox_rows)",
        "max by (status) (tidings_outbox_rowz)",
    );
    let (ok, out) = check(&dir);
    assert!(!ok, "{out}");
    assert!(out.contains("unknown metric tidings_outbox_rowz"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_alert_on_an_unknown_metric_fails_the_checks() {
    let dir = copy();
    edit(
        &dir.join("deploy/telemetry/alerts.yaml"),
        "tidings_delivery_log_errors_total",
        "tidings_delivery_log_error_total",
    );
    let (ok, out) = check(&dir);
    assert!(!ok, "{out}");
    assert!(
        out.contains("alerts.yaml: unknown metric tidings_delivery_log_error_total"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_alert_that_no_longer_fires_when_its_test_says_fails_the_checks() {
    let dir = copy();
    edit(
        &dir.join("deploy/telemetry/alerts.yaml"),
        "max(tidings_outbox_oldest_due_seconds) > 300",
        "max(tidings_outbox_oldest_due_seconds) > 3000",
    );
    let (ok, out) = check(&dir);
    assert!(!ok, "{out}");
    assert!(out.contains("a rule test fails"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_dashboard_that_is_not_json_fails_the_checks() {
    let dir = copy();
    edit(
        &dir.join("deploy/grafana/dashboards/push-services.json"),
        "{",
        "{,",
    );
    let (ok, out) = check(&dir);
    assert!(!ok, "{out}");
    assert!(out.contains("push-services.json: not valid JSON"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

const RUNBOOK_BASE: &str = "https://github.com/tidings/tidings/blob/main/docs/runbooks.md";

#[test]
fn a_relative_runbook_url_fails_the_checks() {
    let dir = copy();
    edit(
        &dir.join("deploy/telemetry/alerts.yaml"),
        &format!("runbook_url: {RUNBOOK_BASE}#tidingsvapidrejected"),
        "runbook_url: docs/runbooks.md#tidingsvapidrejected",
    );
    let (ok, out) = check(&dir);
    assert!(!ok, "{out}");
    assert!(
        out.contains("TidingsVapidRejected: runbook_url 'docs/runbooks.md#tidingsvapidrejected' is not an absolute URL"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_alert_whose_runbook_has_no_section_fails_the_checks() {
    let dir = copy();
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    let runbooks = std::fs::read_to_string(repo().join("docs/runbooks.md")).unwrap();
    std::fs::write(
        dir.join("docs/runbooks.md"),
        runbooks.replace("## TidingsServiceGone", "## Tidings service gone"),
    )
    .unwrap();
    let (ok, out) = check(&dir);
    assert!(!ok, "{out}");
    assert!(
        out.contains("TidingsServiceGone: runbook_url anchor #tidingsservicegone is no section"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An operator publishes the runbooks elsewhere: one command moves every link, in the rules, their
/// tests and the PrometheusRule alike, and the checks (promtool's tests included) still pass.
#[test]
fn runbook_base_moves_every_runbook_url_and_the_checks_still_pass() {
    let dir = copy();
    let script = dir.join("deploy/telemetry/runbook-base");
    let refused = Command::new(&script).arg("wiki/runbooks").output().unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let wiki = "https://wiki.example.com/ops/tidings-runbooks";
    let moved = Command::new(&script).arg(wiki).output().unwrap();
    assert!(moved.status.success(), "{moved:?}");
    for file in [
        "deploy/telemetry/alerts.yaml",
        "deploy/telemetry/alerts.test.yaml",
        "deploy/telemetry/alerts.hours.test.yaml",
        "deploy/k8s/components/prometheus-operator/prometheusrule.yaml",
    ] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let links = text.matches("runbook_url:").count();
        assert!(links >= 2, "{file}: {links} runbook links");
        assert_eq!(text.matches(&format!("{wiki}#")).count(), links, "{file}");
        assert!(!text.contains(RUNBOOK_BASE), "{file}");
    }
    let alerts = std::fs::read_to_string(dir.join("deploy/telemetry/alerts.yaml")).unwrap();
    let rule = std::fs::read_to_string(
        dir.join("deploy/k8s/components/prometheus-operator/prometheusrule.yaml"),
    )
    .unwrap();
    assert_eq!(rule, prometheus_rule(&alerts));
    let (ok, out) = check(&dir);
    assert!(ok, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The PrometheusRule the prometheus-operator component ships: the alerting rules file's groups,
/// as they are, in the operator's wrapper.
fn prometheus_rule(alerts: &str) -> String {
    let groups = alerts
        .find("\ngroups:")
        .map(|at| &alerts[at + 1..])
        .expect("alerts.yaml has a top-level `groups:`");
    let body: String = groups
        .lines()
        .map(|l| {
            if l.is_empty() {
                "\n".to_owned()
            } else {
                format!("  {l}\n")
            }
        })
        .collect();
    format!(
        "# Generated from deploy/telemetry/alerts.yaml (tests/tests/deploy.rs checks it; run that\n\
         # test with TIDINGS_BLESS=1 to rewrite it): the same groups, for the prometheus-operator.\n\
         # Each alert's runbook: docs/runbooks.md.\n\
         apiVersion: monitoring.coreos.com/v1\n\
         kind: PrometheusRule\n\
         metadata:\n  name: tidings\n  labels:\n    app.kubernetes.io/part-of: tidings\n\
         spec:\n{body}"
    )
}

#[test]
fn the_prometheus_rule_holds_the_alerting_rules_file() {
    let alerts = std::fs::read_to_string(repo().join("deploy/telemetry/alerts.yaml")).unwrap();
    let expected = prometheus_rule(&alerts);
    assert_generated(
        &repo().join("deploy/k8s/components/prometheus-operator/prometheusrule.yaml"),
        &expected,
        "alerts.yaml, wrapped by prometheus_rule",
    );
    assert!(expected.contains("    - name: tidings-delivery\n"));
    assert!(expected.contains("      - alert: TidingsOutboxBacklogOld\n"));
}

/// No container engine here, so the image build is checked for what breaks it silently: every
/// workspace member's manifest and every declared binary has a stub in the dependency layer
/// (or cargo cannot load the workspace), and each service has its target, binary and entrypoint.
#[test]
fn the_dockerfile_covers_the_workspace_and_every_service() {
    let dockerfile = std::fs::read_to_string(repo().join("Dockerfile")).unwrap();
    let workspace = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let members = workspace
        .lines()
        .find_map(|l| l.strip_prefix("members = "))
        .expect("members line");
    for member in members
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
    {
        assert!(
            dockerfile.contains(&format!("COPY {member}/Cargo.toml")),
            "the dependency layer does not copy {member}/Cargo.toml"
        );
    }
    for crate_dir in ["shared/testkit", "tests", "tests/benches"] {
        let manifest = std::fs::read_to_string(repo().join(crate_dir).join("Cargo.toml")).unwrap();
        for bin in manifest
            .lines()
            .filter_map(|l| l.strip_prefix("path = \"src/bin/"))
            .map(|p| p.trim_end_matches(".rs\""))
        {
            assert!(
                dockerfile.contains(&format!(" {bin}"))
                    || dockerfile.contains(&format!(" {crate_dir}/src/bin/{bin}.rs")),
                "the dependency layer has no stub for {crate_dir}/src/bin/{bin}.rs"
            );
        }
    }
    // Files compiled into a binary from outside its crate (the api's `web/`) are in the image's
    // build context too.
    let web = std::fs::read_to_string(repo().join("api/src/web.rs")).unwrap();
    let outside: std::collections::BTreeSet<&str> = web
        .split("include_str!(concat!(\"../../")
        .skip(1)
        .filter_map(|rest| rest.split('/').next())
        .collect();
    assert_eq!(outside.iter().copied().collect::<Vec<_>>(), ["web"]);
    for dir in outside {
        assert!(
            dockerfile.contains(&format!("COPY {dir} {dir}\n")),
            "the api compiles in {dir}/ but the Dockerfile does not copy it"
        );
    }
    for service in ["api", "dispatcher", "pusher", "detector"] {
        for needle in [
            format!("FROM runtime AS {service}"),
            format!("--bin tidings-{service}"),
            format!("ENTRYPOINT [\"/usr/local/bin/tidings-{service}\""),
        ] {
            assert!(dockerfile.contains(&needle), "Dockerfile lacks {needle:?}");
        }
        assert!(repo().join(service).join("src/main.rs").exists());
    }
}

/// A new Ed25519 DKIM key, PKCS#8 PEM, as `tidings-api dkim-keygen` prints one.
fn dkim_pem() -> String {
    tidings_email::dkim::generate_ed25519_pem().unwrap()
}

/// Starts what `overlay` describes, as rendered (see `tidings_tests::manifests`): the migration
/// Job must finish, then every service must answer its readiness probe with 200.
async fn smoke(overlay: &str) {
    let db = TestDb::empty().await.unwrap();
    let catalog = FakeCatalog::start().await.unwrap();
    let (vapid_private, vapid_public) = tidings_webpush::vapid::VapidKey::generate().unwrap();
    // The Secrets prod leaves to the operator, with test values.
    // Each service with its own user, as docs/security.md tells an operator to create them.
    let secrets: HashMap<(String, String), String> = [
        ("tidings-db-migrate", "url", db.url.clone()),
        ("tidings-db-api", "url", login_url(&db.url, "api")),
        (
            "tidings-db-dispatcher",
            "url",
            login_url(&db.url, "dispatcher"),
        ),
        ("tidings-db-detector", "url", login_url(&db.url, "detector")),
        ("tidings-vapid", "private-key", vapid_private),
        ("tidings-vapid", "public-key", vapid_public),
        ("tidings-nats-detector", "user", "detector".into()),
        ("tidings-nats-detector", "password", "smoke-detector".into()),
        ("tidings-nats-dispatcher", "user", "dispatcher".into()),
        (
            "tidings-nats-dispatcher",
            "password",
            "smoke-dispatcher".into(),
        ),
        ("tidings-nats-pusher", "user", "pusher".into()),
        ("tidings-nats-pusher", "password", "smoke-pusher".into()),
        ("tidings-nats-api", "user", "api".into()),
        ("tidings-nats-api", "password", "smoke-api".into()),
        (
            "tidings-admin",
            "token",
            "smoke-test-operator-token-0123456789abcdef".into(),
        ),
        (
            "tidings-webhook-keys",
            "keys",
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=".into(),
        ),
        // Email's: the relay's password, the DKIM key, the bounce reports' signing secret.
        ("tidings-smtp", "password", "smoke-smtp".into()),
        ("tidings-dkim", "private-key", dkim_pem()),
        (
            "tidings-email-bounces",
            "secrets",
            "whsec_dGlkaW5ncy1zbW9rZS1ib3VuY2Utc2VjcmV0LTAx".into(),
        ),
        // The CA prod verifies Postgres and NATS against (a ConfigMap the operator creates):
        // the test CA, which signed the local Postgres's and the brokers' certificates.
        ("tidings-ca", "ca.pem", fixture("test-ca/ca.pem")),
    ]
    .into_iter()
    .map(|(s, k, v)| ((s.to_owned(), k.to_owned()), v))
    .collect();
    let rendered = Overlay::render(overlay);
    let mut containers = rendered.containers(&secrets);
    // The brokers know each service's user, as rendered, with its permissions for the
    // rendered prefix: a service missing its credentials, or needing a subject it is not
    // allowed, does not get ready.
    let mut users: Vec<(Service, String, String)> = Vec::new();
    let mut prefix = "tidings";
    for c in containers.iter().filter(|c| !c.to_completion) {
        let program = c.argv[0].rsplit('/').next().unwrap();
        if let Some(service) = Service::of_binary(program) {
            prefix = c.var("TIDINGS_PREFIX").unwrap_or(prefix);
            let secret = |key: &str| {
                c.secret_value(key, &rendered, &secrets)
                    .unwrap_or_else(|| panic!("{}: no {key}(_FILE)", c.workload))
            };
            users.push((
                service,
                secret("NATS_USER"),
                format!("\"{}\"", secret("NATS_PASSWORD")),
            ));
        }
    }
    let users: Vec<(Service, &str, &str)> = users
        .iter()
        .map(|(s, u, p)| (*s, u.as_str(), p.as_str()))
        .collect();
    let mut config = server_config(prefix, &users, Some(("admin", "\"smoke-admin\"")));
    // An overlay that connects with tls:// gets brokers that offer TLS with the test CA's
    // certificate (the harness's own clients may still connect without it).
    let tls = containers
        .iter()
        .any(|c| c.var("NATS_URL").is_some_and(|u| u.starts_with("tls://")));
    if tls {
        let dir = repo().join("tests/fixtures/test-ca");
        config.push_str(&format!(
            "\ntls {{ cert_file: \"{0}/server.pem\", key_file: \"{0}/server-key.pem\" }}\nallow_non_tls: true\n",
            dir.display()
        ));
    }
    let cluster = NatsCluster::with_config(Some(&config)).await.unwrap();
    let local = Local {
        nats: cluster
            .nodes
            .iter()
            .map(|n| n.url.trim_start_matches("nats://").to_owned())
            .collect(),
        database_url: db.url.clone(),
        catalog: catalog.addr.to_string(),
        nowhere: format!("127.0.0.1:{}", free_port().unwrap()),
    };
    let workloads: Vec<&str> = containers.iter().map(|c| c.workload.as_str()).collect();
    for expected in ["api", "dispatcher", "pusher", "detector"] {
        assert!(
            workloads
                .iter()
                .any(|w| w.ends_with(&format!("/{expected}"))),
            "{overlay}: no {expected} in {workloads:?}"
        );
    }
    assert!(
        containers
            .iter()
            .any(|c| c.to_completion && c.argv.ends_with(&["migrate".to_owned()])),
        "{overlay}: nothing applies the schema in {workloads:?}"
    );
    let dir = tempdir();
    let mut running = Vec::new();
    // Init containers and Jobs first: the services' readiness waits for the schema they apply.
    containers.sort_by_key(|c| !c.to_completion);
    for c in &mut containers {
        let ports = localize(c, &local);
        mount_secrets(c, &rendered, &secrets, &dir, &local);
        let program = c.argv[0].rsplit('/').next().unwrap().to_owned();
        let service = program.trim_start_matches("tidings-").to_owned();
        let mut command = Command::new(binary(&service));
        command
            .args(&c.argv[1..])
            .env_clear()
            .envs(c.env.iter().map(|(k, v)| (k, v)))
            .env("HOSTNAME", &c.pod_name);
        if c.to_completion {
            let out = command.output().unwrap();
            assert!(
                out.status.success(),
                "{overlay}: {} ({:?}) failed:\n{}",
                c.workload,
                c.argv,
                String::from_utf8_lossy(&out.stderr)
            );
            continue;
        }
        let log_path = dir.join(format!("{}.log", c.workload.replace('/', "-")));
        let log = std::fs::File::create(&log_path).unwrap();
        let child = command
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let (path, port) = c.readiness.clone().expect("a readiness probe");
        let local_port = *ports
            .get(&port)
            .unwrap_or_else(|| panic!("{}: probe port {port} is no *_LISTEN port", c.workload));
        running.push((
            c.workload.clone(),
            child,
            log_path,
            format!("http://127.0.0.1:{local_port}{path}"),
        ));
    }
    for (workload, child, log_path, url) in &mut running {
        let started = Instant::now();
        loop {
            if let Ok(r) = reqwest::get(url.as_str()).await
                && r.status() == 200
            {
                break;
            }
            let log = || std::fs::read_to_string(&*log_path).unwrap_or_default();
            if let Ok(Some(status)) = child.try_wait() {
                panic!("{overlay}: {workload} exited ({status}):\n{}", log());
            }
            poll_wait(started, 60, || {
                format!("{overlay}: {workload} not ready at {url}:\n{}", log())
            })
            .await;
        }
        eprintln!("{overlay}: {workload} ready in {:?}", started.elapsed());
    }
    for (_, mut child, _, _) in running {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_rendered_dev_overlay_starts_to_ready() {
    smoke("dev").await;
}

#[tokio::test]
async fn the_rendered_prod_overlay_starts_to_ready() {
    smoke("prod").await;
}

/// The most replicas a workload of `overlay` runs: its HPA's maximum, else its `replicas`, plus
/// the pods a rolling update adds (a Deployment's default surge of 25 %, rounded up).
fn max_pods(overlay: &Overlay, kind: &str, name: &str) -> u32 {
    let workload = overlay.find(kind, name).unwrap();
    let scaler = |kind: &str| {
        overlay
            .docs()
            .iter()
            .find(move |d| d["kind"] == kind && d["spec"]["scaleTargetRef"]["name"] == name)
    };
    let replicas = scaler("ScaledObject")
        .map(|keda| &keda["spec"]["maxReplicaCount"])
        .or_else(|| scaler("HorizontalPodAutoscaler").map(|hpa| &hpa["spec"]["maxReplicas"]))
        .unwrap_or(&workload["spec"]["replicas"])
        .as_u64()
        .unwrap_or(1);
    let replicas = u32::try_from(replicas).unwrap();
    let surge = &workload["spec"]["strategy"]["rollingUpdate"]["maxSurge"];
    match (kind, surge.as_u64()) {
        ("Deployment", Some(n)) => replicas + u32::try_from(n).unwrap(),
        ("Deployment", None) => {
            assert!(
                surge.is_null(),
                "{name}: a maxSurge this test does not read: {surge}"
            );
            replicas + replicas.div_ceil(4)
        }
        _ => replicas,
    }
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Placeholders for the Secrets the prod overlay leaves to the operator: for tests that read the
/// rendered containers' settings and start nothing.
fn placeholder_secrets() -> HashMap<(String, String), String> {
    [
        ("tidings-db-migrate", "url"),
        ("tidings-db-api", "url"),
        ("tidings-db-dispatcher", "url"),
        ("tidings-db-detector", "url"),
        ("tidings-nats-detector", "user"),
        ("tidings-nats-detector", "password"),
        ("tidings-nats-dispatcher", "user"),
        ("tidings-nats-dispatcher", "password"),
        ("tidings-nats-pusher", "user"),
        ("tidings-nats-pusher", "password"),
        ("tidings-nats-api", "user"),
        ("tidings-nats-api", "password"),
        ("tidings-vapid", "private-key"),
        ("tidings-vapid", "public-key"),
        ("tidings-admin", "token"),
        ("tidings-webhook-keys", "keys"),
    ]
    .into_iter()
    .map(|(s, k)| ((s.to_owned(), k.to_owned()), "placeholder".to_owned()))
    .collect()
}

/// Postgres' default `max_connections` is 100, 3 of them reserved for superusers; the rest of
/// this room is left for operators and the schema's init containers.
const CONNECTION_BUDGET: u32 = 90;

#[test]
fn the_prod_overlay_at_its_autoscaling_maximum_fits_postgres_default_connection_limit() {
    let rendered = Overlay::render("prod");
    // Only the pool sizes matter here.
    let secrets = placeholder_secrets();
    let mut total = 0;
    let mut table = Vec::new();
    for c in rendered
        .containers(&secrets)
        .iter()
        .filter(|c| !c.to_completion)
    {
        let (kind, rest) = c.workload.split_once('/').unwrap();
        let name = rest.split('/').next().unwrap();
        // The service's own flags read the pool size: the rendered value, else its default.
        let args = |required: &[&str], key: &str| -> Vec<String> {
            let mut args: Vec<String> = required.iter().map(|a| (*a).to_owned()).collect();
            if let Some(v) = c.var(key) {
                args.extend(["--db-pool".to_owned(), v.to_owned()]);
            }
            args
        };
        const WORKER: [&str; 4] = ["--database-url", "-", "--source-url", "-"];
        let pool = match name {
            "api" => {
                let args = args(&["--database-url", "-"], "TIDINGS_API_DB_POOL");
                parsed_defaults::<tidings_api::Config>(&strs(&args)).db_pool
            }
            "dispatcher" => {
                let args = args(&WORKER, "TIDINGS_DISPATCHER_DB_POOL");
                parsed_defaults::<tidings_dispatcher::Config>(&strs(&args)).db_pool
            }
            "detector" => {
                let args = args(&WORKER, "TIDINGS_DETECTOR_DB_POOL");
                parsed_defaults::<tidings_detector::Config>(&strs(&args)).db_pool
            }
            "pusher" => {
                assert!(
                    c.var("DATABASE_URL").is_none(),
                    "the pusher has no database"
                );
                0
            }
            other => panic!("a workload this test does not know: {other}"),
        };
        let pods = max_pods(&rendered, kind, name);
        total += pods * pool;
        table.push(format!("{name}: {pods} pods × {pool} = {}", pods * pool));
    }
    eprintln!("{}\ntotal {total} of {CONNECTION_BUDGET}", table.join("\n"));
    assert!(
        total <= CONNECTION_BUDGET,
        "at its maximum the prod overlay opens {total} Postgres connections:\n{}",
        table.join("\n")
    );
}

/// The dev overlay's Postgres creates the services' users on first start with a script of its
/// own; run here against the stack's server (twice: a restart must not fail), each login must
/// then be a member of its service's role.
#[tokio::test]
async fn the_dev_postgres_init_script_creates_each_service_user_in_its_role() {
    let rendered = Overlay::render("dev");
    let script = rendered
        .find("ConfigMap", "postgres-init")
        .expect("the dev overlay has postgres-init")["data"]["tidings-users.sh"]
        .as_str()
        .expect("the script")
        .to_owned();
    let db = TestDb::empty().await.unwrap();
    let admin: sqlx::postgres::PgConnectOptions =
        stack().unwrap().admin_database_url.parse().unwrap();
    for _ in 0..2 {
        tidings_tests::harness::succeeds(
            Command::new("sh")
                .args(["-c", &script])
                .env("PGHOST", admin.get_host())
                .env("PGPORT", admin.get_port().to_string())
                .env("POSTGRES_USER", admin.get_username())
                .env("POSTGRES_DB", &db.name)
                .env("TIDINGS_API_PASSWORD", "a")
                .env("TIDINGS_DISPATCHER_PASSWORD", "b")
                .env("TIDINGS_DETECTOR_PASSWORD", "c"),
            "postgres-init",
        );
    }
    for (_, login, role) in DB_LOGINS {
        let (can_login, member): (bool, bool) = sqlx::query_as(
            "SELECT rolcanlogin, pg_has_role(rolname, $2, 'MEMBER') FROM pg_roles WHERE rolname = $1",
        )
        .bind(login)
        .bind(role)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert!(
            can_login && member,
            "{login}: login {can_login}, member of {role} {member}"
        );
    }
}

/// Every Secret the prod overlay reads, with every key it reads from it, is in operations.md's
/// Secrets table, which an operator follows to create them before the first apply (a Secret
/// missing there leaves its pods in CreateContainerConfigError).
#[test]
fn the_operations_secrets_table_lists_every_secret_and_key_the_prod_overlay_reads() {
    fn walk(v: &serde_json::Value, found: &mut std::collections::BTreeSet<(String, String)>) {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(r) = map.get("secretKeyRef") {
                    found.insert((
                        r["name"].as_str().unwrap().to_owned(),
                        r["key"].as_str().unwrap().to_owned(),
                    ));
                }
                if let Some(secret) = map.get("secret").filter(|s| s["secretName"].is_string()) {
                    let name = secret["secretName"].as_str().unwrap();
                    for item in secret["items"].as_array().into_iter().flatten() {
                        found.insert((name.to_owned(), item["key"].as_str().unwrap().to_owned()));
                    }
                }
                map.values().for_each(|v| walk(v, found));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, found)),
            _ => {}
        }
    }
    let mut read = std::collections::BTreeSet::new();
    for doc in Overlay::render("prod").docs() {
        walk(doc, &mut read);
    }
    assert!(read.len() >= 8, "{read:?}");
    let operations = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    let table: Vec<&str> = operations
        .lines()
        .skip_while(|l| !l.contains("| Secret | keys | read by |"))
        .take_while(|l| l.trim_start().starts_with('|'))
        .collect();
    assert!(table.len() > 2, "operations.md has no Secrets table");
    for (secret, key) in &read {
        let row = table
            .iter()
            .find(|row| {
                row.split('|')
                    .nth(1)
                    .is_some_and(|names| names.contains(&format!("`{secret}`")))
            })
            .unwrap_or_else(|| panic!("operations.md's Secrets table lacks {secret}"));
        assert!(
            row.split('|')
                .nth(2)
                .is_some_and(|keys| keys.contains(&format!("`{key}`"))),
            "operations.md's Secrets table lacks the key {key} of {secret}: {row}"
        );
    }
}

/// Prod verifies Postgres's certificate against the CA it mounts (PGSSLMODE=verify-full): the
/// rendered migrate container, run against the local Postgres (TLS with the test CA's
/// certificate), applies the schema with the test CA and is refused with another CA.
#[tokio::test]
async fn the_prod_overlay_refuses_a_postgres_its_ca_did_not_sign() {
    for (ca, works) in [("tls/cert.pem", false), ("test-ca/ca.pem", true)] {
        let db = TestDb::empty().await.unwrap();
        // The other containers' references get placeholders: only migrate runs.
        let placeholders = [
            ("tidings-vapid", "public-key"),
            ("tidings-nats-api", "user"),
            ("tidings-nats-detector", "user"),
            ("tidings-nats-dispatcher", "user"),
            ("tidings-nats-pusher", "user"),
        ]
        .map(|key| (key, "-".to_owned()));
        let secrets: HashMap<(String, String), String> = [
            (("tidings-db-migrate", "url"), db.url.clone()),
            (("tidings-ca", "ca.pem"), fixture(ca)),
        ]
        .into_iter()
        .chain(placeholders)
        .map(|((s, k), v)| ((s.to_owned(), k.to_owned()), v))
        .collect();
        let rendered = Overlay::render("prod");
        let mut migrate = rendered
            .containers(&secrets)
            .into_iter()
            .find(|c| c.to_completion && c.argv.ends_with(&["migrate".to_owned()]))
            .expect("prod's migrate container");
        assert_eq!(migrate.var("PGSSLMODE"), Some("verify-full"));
        let local = Local {
            nats: vec!["127.0.0.1:1".into()],
            database_url: db.url.clone(),
            catalog: "127.0.0.1:1".into(),
            nowhere: "127.0.0.1:1".into(),
        };
        let dir = tempdir();
        localize(&mut migrate, &local);
        mount_secrets(&mut migrate, &rendered, &secrets, &dir, &local);
        let out = Command::new(binary("api"))
            .args(&migrate.argv[1..])
            .env_clear()
            .envs(migrate.env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.success(), works, "CA {ca}: {stderr}");
        if !works {
            assert!(stderr.contains("UnknownIssuer"), "{stderr}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The egress policies of both overlays, tried destination by destination: the pusher reaches
/// the internet on any port but nothing inside the cluster beyond NATS, DNS and the Collector;
/// the others reach Postgres, NATS and their sources; nobody reaches the cloud metadata address.
#[test]
fn each_service_may_send_only_where_its_work_is() {
    use std::net::IpAddr;
    use tidings_tests::network_policy::Destination;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let dns: &[(&str, &str)] = &[("k8s-app", "kube-dns")];
    let any: &[(&str, &str)] = &[("app", "something")];
    let inside = |addr: &str, port: u16, protocol: &'static str, ns: &'static str, labels| {
        (ip(addr), port, protocol, Some((ns, labels)))
    };
    let outside = |addr: &str, port: u16| (ip(addr), port, "TCP", None);
    // (where, who may send there: pusher, api, dispatcher, detector)
    let cases = [
        (
            inside("10.96.0.10", 53, "UDP", "kube-system", dns),
            [true; 4],
        ),
        (inside("10.4.0.9", 4222, "TCP", "nats", any), [true; 4]),
        (
            inside("10.7.0.3", 4318, "TCP", "monitoring", any),
            [true; 4],
        ),
        (inside("10.7.0.3", 4318, "TCP", "default", any), [false; 4]),
        (
            inside("10.5.0.3", 5432, "TCP", "tidings", any),
            [false, true, true, true],
        ),
        (
            inside("10.6.0.2", 443, "TCP", "catalog", any),
            [false, true, true, true],
        ),
        (inside("10.4.0.7", 8080, "TCP", "default", any), [false; 4]),
        (
            inside("10.96.0.1", 443, "TCP", "default", any),
            [false, true, true, true],
        ),
        (outside("169.254.169.254", 80), [false; 4]),
        (outside("fd00:ec2::254", 443), [false; 4]),
        (outside("172.20.0.1", 443), [false, true, true, true]),
        (outside("93.184.216.34", 443), [true; 4]),
        (outside("93.184.216.34", 8443), [true, false, false, false]),
        (outside("2606:2800:220:1::1", 443), [true, true, true, true]),
        (outside("fd00::1", 443), [false, true, true, true]),
        (outside("::ffff:10.0.0.1", 443), [false, true, true, true]),
        (outside("192.168.1.1", 5432), [false, true, true, true]),
    ];
    for overlay in ["dev", "prod"] {
        let o = Overlay::render(overlay);
        for ((addr, port, protocol, pod), allowed) in &cases {
            let to = Destination {
                ip: *addr,
                port: *port,
                protocol,
                pod: *pod,
            };
            for (workload, allowed) in ["pusher", "api", "dispatcher", "detector"]
                .into_iter()
                .zip(allowed)
            {
                assert_eq!(
                    o.egress_allows(workload, &to),
                    *allowed,
                    "{overlay}: {workload} to {addr}:{port}/{protocol} in {pod:?}"
                );
            }
        }
    }
}

/// KEDA's ScaledObjects scale on the lag of the consumers the services really run, under the
/// prod overlay's prefix, and replace the CPU-only HPAs; without KEDA those HPAs remain.
#[test]
fn the_scaled_objects_watch_the_consumers_the_services_run() {
    use tidings_domain::subjects::{StreamKind, Subjects};
    let prod = Overlay::render("prod");
    let prefix = config_var(&prod, "TIDINGS_PREFIX")
        .unwrap_or(Subjects::DEFAULT_PREFIX)
        .to_owned();
    let subjects = Subjects::new(&prefix).unwrap();
    let mut run: Vec<(String, &str)> = tidings_bus::streams::CONSUMERS
        .iter()
        .map(|(kind, consumer)| (subjects.stream(*kind), *consumer))
        .collect();
    for channel in [
        tidings_domain::Channel::Webhook,
        tidings_domain::Channel::Email,
    ] {
        run.push((
            subjects.stream(StreamKind::Push),
            tidings_pusher::worker::consumer_for(channel),
        ));
    }
    let mut watched = Vec::new();
    for name in ["pusher", "dispatcher"] {
        let so = prod.find("ScaledObject", name).unwrap();
        assert_eq!(so["spec"]["scaleTargetRef"]["name"], name);
        let triggers = so["spec"]["triggers"].as_array().unwrap();
        assert!(
            triggers.iter().any(|t| t["type"] == "cpu"),
            "{name} keeps CPU"
        );
        for t in triggers.iter().filter(|t| t["type"] == "nats-jetstream") {
            let m = &t["metadata"];
            let pair = (
                m["stream"].as_str().unwrap().to_owned(),
                m["consumer"].as_str().unwrap(),
            );
            assert!(
                run.contains(&pair),
                "{name} watches {pair:?}, which nothing runs"
            );
            watched.push(pair);
        }
        assert!(prod.find("HorizontalPodAutoscaler", name).is_none());
    }
    watched.sort();
    run.sort();
    assert_eq!(watched, run, "every consumer's lag scales its service");
    let dev = Overlay::render("dev");
    for name in ["pusher", "dispatcher"] {
        assert!(dev.find("HorizontalPodAutoscaler", name).is_some());
        assert!(dev.find("ScaledObject", name).is_none());
    }
}

/// The prod overlay exposes the api through an Ingress to its public port only, believes exactly
/// that one proxy's X-Forwarded-For, and splits each rate over as many replicas as it runs.
#[test]
fn the_prod_ingress_and_the_limits_agree() {
    let prod = Overlay::render("prod");
    let ingress = prod.find("Ingress", "api").expect("an Ingress for the api");
    for rule in ingress["spec"]["rules"].as_array().unwrap() {
        for path in rule["http"]["paths"].as_array().unwrap() {
            let backend = &path["backend"]["service"];
            assert_eq!(backend["name"], "api", "{path}");
            assert_eq!(
                backend["port"]["name"], "http",
                "only the public port: {path}"
            );
        }
    }
    assert_eq!(config_var(&prod, "TIDINGS_API_TRUSTED_PROXIES"), Some("1"));
    let replicas = prod.find("Deployment", "api").unwrap()["spec"]["replicas"]
        .as_u64()
        .unwrap();
    assert_eq!(
        config_var(&prod, "TIDINGS_API_REPLICAS"),
        Some(replicas.to_string().as_str()),
        "each replica keeps 1/N of every rate"
    );
    assert!(prod.find("HorizontalPodAutoscaler", "api").is_none());
}

/// Every service's runtime starts the threads the manifests give it, not one per core of the node
/// it lands on (a pod without a CPU limit sees them all, and idle threads woken to steal work cost
/// CPU), and at least as many as the cores its replica requests, so the request can be used.
#[test]
fn each_service_runs_as_many_runtime_threads_as_the_manifests_say() {
    for overlay in ["dev", "prod"] {
        let o = Overlay::render(overlay);
        let services: Vec<_> = (o.containers(&placeholder_secrets()).into_iter())
            .filter(|c| !c.to_completion)
            .collect();
        assert_eq!(services.len(), 4, "{overlay}: not the four services");
        for c in services {
            // The environment as the container gets it: ConfigMaps, then its own `env`.
            let threads: u32 = c
                .var("TOKIO_WORKER_THREADS")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{}: no number of runtime threads", c.workload));
            let request = (c.cpu_request.as_deref())
                .unwrap_or_else(|| panic!("{} requests no CPU", c.workload));
            let cores: f64 = match request.strip_suffix('m') {
                Some(m) => m.parse::<f64>().unwrap() / 1000.0,
                None => request.parse().unwrap(),
            };
            assert!(
                f64::from(threads) >= cores,
                "{}: requests {request} of CPU but runs {threads} runtime threads",
                c.workload
            );
        }
    }
}

/// A setting of the rendered `tidings-config` ConfigMap (its name carries kustomize's hash).
fn config_var<'a>(overlay: &'a Overlay, key: &str) -> Option<&'a str> {
    overlay.docs().iter().find(|d| {
        d["kind"] == "ConfigMap"
            && d["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("tidings-config"))
    })?["data"][key]
        .as_str()
}

/// The release step: `deploy/pin-images` pins every prod image by digest, refusing a list that
/// misses a service or is malformed; until a release, the prod overlay runs tags pulled always.
#[test]
fn a_release_pins_every_prod_image_by_digest() {
    let images = |root: &Path| -> Vec<String> {
        let out = tidings_tests::harness::succeeds(
            Command::new("kubectl")
                .arg("kustomize")
                .arg(root.join("deploy/k8s/overlays/prod")),
            "rendering prod",
        );
        let mut found: Vec<String> = String::from_utf8(out)
            .unwrap()
            .lines()
            .filter_map(|l| l.trim().strip_prefix("image: "))
            .map(str::to_owned)
            .collect();
        found.sort();
        found.dedup();
        found
    };
    let tagged = images(&repo());
    assert_eq!(tagged.len(), 4, "{tagged:?}");
    assert!(tagged.iter().all(|i| i.ends_with(":0.1.0")), "{tagged:?}");
    let prod = std::fs::read_to_string(repo().join("deploy/k8s/overlays/prod/kustomization.yaml"))
        .unwrap();
    assert!(
        prod.contains("imagePullPolicy"),
        "a tag is pulled each time"
    );

    let dir = copy();
    let pin = |digests: &str| {
        let file = dir.join("digests");
        std::fs::write(&file, digests).unwrap();
        Command::new(dir.join("deploy/pin-images"))
            .arg(&file)
            .output()
            .unwrap()
    };
    let digest = |n: u32| format!("sha256:{n:064}");
    let line = |service: &str, n| format!("ghcr.io/tidings/tidings-{service}@{}", digest(n));
    let all: Vec<String> = ["api", "dispatcher", "pusher", "detector"]
        .iter()
        .zip(1..)
        .map(|(s, n)| line(s, n))
        .collect();
    for bad in [
        all[..3].join("\n"),
        format!("{}\n{}", all.join("\n"), all[0]),
        all.join("\n").replace("sha256:0", "sha256:g"),
        format!(
            "{}\nghcr.io/tidings/tidings-mailer@{}",
            all.join("\n"),
            digest(9)
        ),
    ] {
        let out = pin(&bad);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert_eq!(images(&dir), tagged, "a refused list changes nothing");
    }
    let out = pin(&format!("# release 0.2.0\n{}\n", all.join("\n")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut pinned = all.clone();
    pinned.sort();
    assert_eq!(images(&dir), pinned);
    let (ok, report) = check(&dir);
    assert!(ok, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
