//! The Grafana dashboards, the alerting rules and the datasource links read what the running
//! services actually emit: every PromQL selector names a family some service exports from the
//! moment it starts, with label values that exist (no panel is empty by design); every TraceQL
//! search names spans and attributes the services send; a log line's trace id and a latency
//! exemplar lead to the trace they belong to.

use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Instant;
use tidings_domain::outbox::Status;
use tidings_domain::trigger::Trigger;
use tidings_tests::fake_push::FakePushService;
use tidings_tests::harness::{poll_wait, tool};
use tidings_tests::otlp::traced_pipeline;
use tidings_tests::scenario::Scenario;
use tidings_tests::services::{Pipeline, SERVICES};

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A YAML file as JSON (the Prometheus project's own parser is Python's; tests have no YAML
/// parser of their own).
fn yaml(path: &str) -> Value {
    let out = std::process::Command::new(tool("python").unwrap())
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
        ])
        .arg(repo().join(path))
        .output()
        .unwrap();
    assert!(out.status.success(), "{path}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn dashboards() -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = std::fs::read_dir(repo().join("deploy/grafana/dashboards"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (
                name,
                serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Every string under a key `key` in `v`, with the datasource type of the object holding it.
fn queries(v: &Value, key: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(q)) = m.get(key) {
                let ds = m.get("datasource").and_then(|d| d["type"].as_str());
                out.push((ds.unwrap_or("").to_owned(), q.clone()));
            }
            m.values().for_each(|v| queries(v, key, out));
        }
        Value::Array(a) => a.iter().for_each(|v| queries(v, key, out)),
        _ => {}
    }
}

/// A label matcher of a selector: `label op "value"`.
#[derive(Debug)]
struct Matcher {
    label: String,
    op: String,
    value: String,
}

/// The metric selectors of a PromQL expression: each `tidings_…`/`process_…` name with its
/// matchers (names inside quotes, and recording rules' `tidings:…`, are not selectors).
fn selectors(expr: &str) -> Vec<(String, Vec<Matcher>)> {
    let b = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'"' {
            i += 1 + expr[i + 1..].find('"').unwrap();
            i += 1;
            continue;
        }
        if !ident(b[i]) || (i > 0 && ident(b[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && ident(b[i]) {
            i += 1;
        }
        let name = &expr[start..i];
        if !(name.starts_with("tidings_") || name.starts_with("process_")) {
            continue;
        }
        let mut matchers = Vec::new();
        if b.get(i) == Some(&b'{') {
            let end = i + expr[i..].find('}').unwrap();
            for part in expr[i + 1..end].split(',').filter(|p| !p.trim().is_empty()) {
                let op_at = part.find(['=', '!']).unwrap();
                let op_len = if part[op_at + 1..].starts_with(['=', '~']) {
                    2
                } else {
                    1
                };
                matchers.push(Matcher {
                    label: part[..op_at].trim().to_owned(),
                    op: part[op_at..op_at + op_len].to_owned(),
                    value: part[op_at + op_len..].trim().trim_matches('"').to_owned(),
                });
            }
            i = end + 1;
        }
        out.push((name.to_owned(), matchers));
    }
    out
}

/// What one service exposes: its families, and each family's series (label sets).
#[derive(Default)]
struct Exposed {
    families: HashSet<String>,
    series: HashMap<String, Vec<HashMap<String, String>>>,
}

fn exposed(text: &str) -> Exposed {
    let mut e = Exposed::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            e.families
                .insert(rest.split(' ').next().unwrap().to_owned());
        }
    }
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let sample = line.split([' ', '{']).next().unwrap();
        let Some(family) = family_of(&e.families, sample) else {
            continue;
        };
        let mut labels = HashMap::new();
        if let Some(inner) = line
            .split_once('{')
            .and_then(|(_, r)| r.split_once('}'))
            .map(|(l, _)| l)
        {
            for pair in inner.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap();
                labels.insert(k.to_owned(), v.trim_matches('"').to_owned());
            }
        }
        e.series.entry(family).or_default().push(labels);
    }
    e
}

/// The family a sample (or a selector's metric name) belongs to.
fn family_of(families: &HashSet<String>, name: &str) -> Option<String> {
    if families.contains(name) {
        return Some(name.to_owned());
    }
    ["_total", "_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|s| name.strip_suffix(s))
        .find(|base| families.contains(*base))
        .map(str::to_owned)
}

/// Whether a label `value` satisfies a matcher: `=` exactly, `=~` one of its alternatives
/// (the only regexes the dashboards use); other operators are not checked.
fn satisfies(m: &Matcher, value: &str) -> bool {
    match m.op.as_str() {
        "=" => value == m.value,
        "=~" if m
            .value
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c == b'_' || c == b'|') =>
        {
            m.value.split('|').any(|alt| alt == value)
        }
        _ => true,
    }
}

/// Families whose every label set includes a value known only once traffic comes (the push
/// service's host), so they have no series, and no `# TYPE` line, before the first push. The
/// registry still lists them (`tidings_runtime::metrics::FAMILIES`, checked by deploy/check).
const GROWN_BY_TRAFFIC: &[&str] = &["tidings_push_requests"];

/// Labels Prometheus adds to every target (the scrape config's `service`, `instance`, `job`)
/// or that a histogram's buckets carry.
const TARGET_LABELS: &[&str] = &["service", "instance", "job", "le"];

/// What is wrong with `exprs` (file, PromQL) given what each service exposed at start; and how
/// many selectors were checked.
fn problems(
    exprs: &[(String, String)],
    by_service: &HashMap<&str, Exposed>,
) -> (usize, Vec<String>) {
    let mut problems = Vec::new();
    let mut checked = 0;
    for (file, expr) in exprs {
        for (metric, matchers) in selectors(expr) {
            checked += 1;
            let exporters: Vec<&str> = SERVICES
                .iter()
                .copied()
                .filter(|svc| family_of(&by_service[svc].families, &metric).is_some())
                .collect();
            let Some(first) = exporters.first() else {
                if !GROWN_BY_TRAFFIC.iter().any(|f| metric.starts_with(f)) {
                    problems.push(format!(
                        "{file}: no service exports {metric} at start: {expr}"
                    ));
                }
                continue;
            };
            let family = family_of(&by_service[first].families, &metric).unwrap();
            for m in &matchers {
                if m.label == "service" && m.op == "=" && !exporters.contains(&m.value.as_str()) {
                    problems.push(format!(
                        "{file}: {metric} is not exported by service {:?} (only {exporters:?}): {expr}",
                        m.value
                    ));
                }
            }
            // Label values are known at start only for families whose series are created then
            // (outcomes, reasons, kinds); the others get theirs as traffic comes (a push host).
            let series: Vec<&HashMap<String, String>> = exporters
                .iter()
                .flat_map(|svc| by_service[svc].series.get(&family).into_iter().flatten())
                .collect();
            if series.is_empty() {
                continue;
            }
            for m in matchers
                .iter()
                .filter(|m| !TARGET_LABELS.contains(&m.label.as_str()))
            {
                let values: Vec<&str> = series
                    .iter()
                    .filter_map(|l| l.get(&m.label).map(String::as_str))
                    .collect();
                if values.is_empty() {
                    problems.push(format!("{file}: {metric} has no label {}: {expr}", m.label));
                } else if !values.iter().any(|v| satisfies(m, v)) {
                    problems.push(format!(
                        "{file}: no series of {metric} has {}{}{:?} (it has {values:?}): {expr}",
                        m.label, m.op, m.value
                    ));
                }
            }
        }
    }
    (checked, problems)
}

#[tokio::test]
async fn every_dashboard_and_alert_query_reads_series_the_services_export_at_start() {
    let s = Scenario::new().await;
    let p = Pipeline::start(&s, &[]).await;
    let mut by_service: HashMap<&str, Exposed> = HashMap::new();
    for svc in SERVICES {
        let text = reqwest::get(format!("{}/metrics", p.ops_url(svc)))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        by_service.insert(svc, exposed(&text));
    }
    p.stop().await;
    s.cleanup().await;

    let mut exprs: Vec<(String, String)> = Vec::new();
    for (name, d) in dashboards() {
        let mut found = Vec::new();
        queries(&d, "expr", &mut found);
        assert!(!found.is_empty(), "{name} has no PromQL query");
        exprs.extend(found.into_iter().map(|(_, q)| (name.clone(), q)));
    }
    let mut found = Vec::new();
    queries(&yaml("deploy/telemetry/alerts.yaml"), "expr", &mut found);
    exprs.extend(
        found
            .into_iter()
            .map(|(_, q)| ("alerts.yaml".to_owned(), q)),
    );

    let (checked, problems) = problems(&exprs, &by_service);
    assert!(checked > 40, "only {checked} selectors found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The check has teeth: an unknown family, a misspelt label value, a label the family does not
/// have and a family the named service does not export are each reported; a good query is not.
/// Every family a crate registers is listed in `tidings_runtime::metrics::FAMILIES` (what the
/// dashboards, the alerts and deploy/check go by) with its type, and every listed family is
/// registered by some crate. A process that is none of the services registers them all.
#[test]
fn the_families_the_crates_register_are_the_listed_ones() {
    use tidings_runtime::metrics::{FAMILIES, metrics};
    // A family shows up in the exposition once it has a series.
    macro_rules! touch {
        ($m:expr => $($family:ident),*) => { $( let _ = $m.$family.get_or_create(&Default::default()); )* };
    }
    tidings_store::transition::init_metrics();
    touch!(metrics() => consumer_pending, consumer_ack_pending, db_pool_connections, failures);
    touch!(tidings_bus::metrics::metrics() => dead_lettered, delivery_log_errors);
    touch!(tidings_source::metrics() => source_errors, source_requests, pages_too_complex);
    touch!(tidings_detector::metrics::metrics() => shard_count, detections, hinted_items);
    touch!(tidings_dispatcher::metrics::metrics() => outbox_rows, ingested, webhook_endpoints, secrets_unopened, outbox_held, held, released);
    touch!(tidings_pusher::metrics::metrics() => pushes, push_duration);
    touch!(tidings_api::metrics::metrics() => http_requests, http_duration, rate_limited, hints);
    let text = metrics().encode();
    let mut registered: Vec<(String, String)> = text
        .lines()
        .filter_map(|line| {
            let mut parts = line.strip_prefix("# TYPE ")?.split(' ');
            Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
        })
        .collect();
    registered.sort();
    let mut listed: Vec<(String, String)> = FAMILIES
        .iter()
        .map(|(n, k, _)| ((*n).to_owned(), (*k).to_owned()))
        .collect();
    listed.sort();
    assert_eq!(registered, listed);
    tidings_tests::harness::assert_generated(
        &repo_root().join("docs/metrics.md"),
        &metrics_reference(&text),
        "the metric registrations (tests/tests/dashboards.rs)",
    );
    // The longest retry schedule (~1.5 h) fits below detection to delivery's last finite bucket.
    let last = text
        .lines()
        .filter_map(|l| {
            l.strip_prefix("tidings_detection_to_delivery_seconds_bucket{le=\"")?
                .split('"')
                .next()?
                .parse::<f64>()
                .ok()
        })
        .filter(|b| b.is_finite())
        .fold(0.0, f64::max);
    assert!(last >= 2.0 * 3600.0, "{last}");
}

#[test]
fn the_query_check_finds_what_would_leave_a_panel_empty() {
    let mut by_service: HashMap<&str, Exposed> =
        SERVICES.iter().map(|s| (*s, Exposed::default())).collect();
    by_service.insert(
        "dispatcher",
        exposed(concat!(
            "# TYPE tidings_outbox_transitions counter\n",
            "tidings_outbox_transitions_total{to=\"sent\",reason=\"\"} 0\n",
            "tidings_outbox_transitions_total{to=\"dropped\",reason=\"condition_lost\"} 0\n",
            "# TYPE tidings_push_duration_seconds histogram\n",
        )),
    );
    let q = |e: &str| vec![("d.json".to_owned(), e.to_owned())];
    for good in [
        r#"sum by (to) (rate(tidings_outbox_transitions_total{to=~"sent|dropped"}[5m])) / ignoring (to) group_left sum(tidings:outbox_ends:rate15m)"#,
        r#"sum(rate(tidings_outbox_transitions_total{service="dispatcher", reason="condition_lost"}[5m]))"#,
        r#"histogram_quantile(0.9, sum by (le) (rate(tidings_push_duration_seconds_bucket{status="2xx"}[5m])))"#,
    ] {
        let (n, found) = problems(&q(good), &by_service);
        assert!(n >= 1 && found.is_empty(), "{good}: {found:?}");
    }
    for (bad, says) in [
        (
            "rate(tidings_outbox_transition_total[5m])",
            "no service exports tidings_outbox_transition_total",
        ),
        (
            r#"tidings_outbox_transitions_total{to="sendt"}"#,
            "no series of tidings_outbox_transitions_total has to=\"sendt\"",
        ),
        (
            r#"tidings_outbox_transitions_total{to=~"sent|failed|retryy"}"#,
            "",
        ),
        (
            r#"tidings_outbox_transitions_total{status="sent"}"#,
            "has no label status",
        ),
        (
            r#"tidings_outbox_transitions_total{service="api"}"#,
            "is not exported by service \"api\"",
        ),
    ] {
        let (_, found) = problems(&q(bad), &by_service);
        if says.is_empty() {
            // An alternation that matches some series reads something.
            assert!(found.is_empty(), "{bad}: {found:?}");
        } else {
            assert!(found.iter().any(|p| p.contains(says)), "{bad}: {found:?}");
        }
    }
    let sel = selectors(r#"sum(x{a="tidings_not_a_selector"}) + tidings_y{b!="", c=~"d|e"}"#);
    assert_eq!(sel.len(), 1, "{sel:?}");
    assert_eq!(sel[0].0, "tidings_y");
    assert_eq!(
        (sel[0].1[0].label.as_str(), sel[0].1[0].op.as_str()),
        ("b", "!=")
    );
    assert_eq!(sel[0].1[1].value, "d|e");
}

/// The TraceQL a search panel runs: span names (`name = "…"`), span attributes (`span.…`) and
/// services (`resource.service.name = "…"`) it names.
fn traceql_names(q: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    let quoted_after = |key: &str| -> Vec<String> {
        q.match_indices(key)
            .filter_map(|(at, _)| {
                let rest = q[at + key.len()..].trim_start().strip_prefix('=')?;
                let rest = rest.trim_start().strip_prefix('"')?;
                Some(rest[..rest.find('"')?].to_owned())
            })
            .collect()
    };
    let names = quoted_after(" name ")
        .into_iter()
        .chain(quoted_after("{ name "))
        .collect();
    let attributes = q
        .match_indices("span.")
        .map(|(at, _)| {
            q[at + 5..]
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                .next()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    (names, attributes, quoted_after("resource.service.name"))
}

#[tokio::test]
async fn trace_panels_exemplars_and_log_links_lead_to_what_the_services_send() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let (p, spans) = traced_pipeline(&s).await;
    let w = s
        .watcher_at(
            "SKU-1",
            Trigger::PriceBelow { threshold: 1200 },
            1500,
            &push.subscription(),
        )
        .await;
    s.catalog.set_price("SKU-1", 1000);
    let started = Instant::now();
    let got = loop {
        let got = spans.lock().unwrap().clone();
        let sent = s.rows(w.watch).await.first().map(|r| r.notification.status);
        if sent == Some(Status::Sent) && got.iter().any(|sp| sp["name"] == "result") {
            break got;
        }
        poll_wait(started, 30, || p.log("dispatcher")).await;
    };
    let span_names: HashSet<&str> = got.iter().filter_map(|sp| sp["name"].as_str()).collect();
    // The kubelet's probes are not traced: they would bury the notifications' traces.
    assert!(
        !span_names
            .iter()
            .any(|n| n.ends_with("/readyz") || n.ends_with("/livez")),
        "{span_names:?}"
    );
    let services: HashSet<&str> = got.iter().filter_map(|sp| sp["service"].as_str()).collect();
    let attributes: HashSet<&str> = got
        .iter()
        .flat_map(|sp| sp["attributes"].as_array().into_iter().flatten())
        .filter_map(|a| a["key"].as_str())
        .collect();

    let mut traceql = Vec::new();
    for (name, d) in dashboards() {
        let mut found = Vec::new();
        queries(&d, "query", &mut found);
        traceql.extend(
            found
                .into_iter()
                .filter(|(ds, _)| ds == "tempo")
                .map(|(_, q)| (name.clone(), q)),
        );
    }
    assert!(traceql.len() >= 3, "{traceql:?}");
    for (file, q) in &traceql {
        let (names, attrs, svcs) = traceql_names(q);
        assert!(
            !names.is_empty() || !attrs.is_empty() || q.contains("status = error"),
            "{file}: {q}"
        );
        for n in names {
            assert!(
                span_names.contains(n.as_str()),
                "{file}: no span is named {n:?}: {q} (spans: {span_names:?})"
            );
        }
        for a in attrs {
            assert!(
                attributes.contains(a.as_str()),
                "{file}: no span has {a:?}: {q}"
            );
        }
        for svc in svcs {
            assert!(
                services.contains(svc.as_str()),
                "{file}: no service {svc:?}: {q}"
            );
        }
    }

    // A latency exemplar is labelled the way the Prometheus datasource looks for (trace_id) and
    // names this notification's trace; a log line inside a span gives the same trace id through
    // the Loki datasource's derived field.
    let trace = got
        .iter()
        .find(|sp| sp["name"] == "result")
        .and_then(|sp| sp["traceId"].as_str())
        .unwrap()
        .to_owned();
    let datasources = yaml("deploy/grafana/provisioning/datasources/tidings.yaml");
    let by_uid = |uid: &str| -> Value {
        datasources["datasources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["uid"] == uid)
            .cloned()
            .unwrap_or_else(|| panic!("no datasource {uid}"))
    };
    let destination = &by_uid("prometheus")["jsonData"]["exemplarTraceIdDestinations"][0];
    assert_eq!(destination["datasourceUid"], "tempo");
    let label = destination["name"].as_str().unwrap();
    let text = p.metrics("dispatcher").await;
    assert!(
        text.lines().any(
            |l| l.starts_with("tidings_detection_to_delivery_seconds_bucket")
                && l.contains(&format!(" # {{{label}=\"{trace}\"}}"))
        ),
        "no exemplar {label}={trace}:\n{text}"
    );
    let derived = &by_uid("loki")["jsonData"]["derivedFields"][0];
    assert_eq!(derived["datasourceUid"], "tempo");
    let line = p
        .log("pusher")
        .lines()
        .find(|l| l.contains("push attempt finished"))
        .expect("the pusher logged the push")
        .to_owned();
    let out = std::process::Command::new(tool("python").unwrap())
        .args([
            "-c",
            "import re, sys; m = re.search(sys.argv[1], sys.argv[2]); print(m.group(1) if m else '')",
        ])
        .arg(derived["matcherRegex"].as_str().unwrap())
        .arg(&line)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), trace, "{line}");
    let to_logs = by_uid("tempo")["jsonData"]["tracesToLogsV2"].clone();
    assert_eq!(to_logs["datasourceUid"], "loki");
    assert!(
        to_logs["query"]
            .as_str()
            .unwrap()
            .contains("${__trace.traceId}")
    );
    p.stop().await;
    s.cleanup().await;
}

fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// docs/metrics.md: every family, as the exposition `text` (one series of each) names it, with
/// its labels, its help and the services that export it.
fn metrics_reference(text: &str) -> String {
    use std::fmt::Write as _;
    use tidings_runtime::metrics::FAMILIES;
    let mut out = String::from(
        "<!-- generated by tests/tests/dashboards.rs from the metric registrations; TIDINGS_BLESS=1 rewrites it -->\n\
         # Metrics\n\n\
         What each service exports at `/metrics` (OpenMetrics text; [operations.md](operations.md#observability)). \
         A service exports the families listed for it, and any other once it has a sample.\n\n\
         | metric | type | labels | exported by | what |\n|---|---|---|---|---|\n",
    );
    for (family, kind, services) in FAMILIES {
        let help = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("# HELP {family} ")))
            .unwrap_or("")
            .trim_end_matches('.')
            .replace('|', "\\|");
        let shown = match *kind {
            "counter" => format!("{family}_total"),
            _ => (*family).to_owned(),
        };
        // The label names of its first series (every family has one: see `touch!` above).
        let labels: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find(|l| {
                l.strip_prefix(*family)
                    .is_some_and(|rest| rest.starts_with(['{', ' ', '_']))
            })
            .and_then(|l| l.split_once('{'))
            .map(|(_, rest)| {
                rest.split(',')
                    .filter_map(|pair| pair.split_once('=').map(|(k, _)| k.trim().to_owned()))
                    .filter(|k| k != "le" && !k.contains('}'))
                    .collect()
            })
            .unwrap_or_default();
        let labels = if labels.is_empty() {
            "—".to_owned()
        } else {
            labels
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "| `{shown}` | {kind} | {labels} | {} | {help} |",
            services.join(", ")
        );
    }
    out
}
