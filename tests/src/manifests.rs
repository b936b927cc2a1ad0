//! The Kubernetes overlays run as a cluster would run them, on this machine: render an overlay
//! with `kubectl kustomize`, take each Tidings container's command, args and environment
//! exactly as rendered (ConfigMaps, Secrets, field references and secret volumes resolved),
//! and start the real binaries with them.
//!
//! Only addresses change, because this is one machine and not a cluster: the hosts of
//! `NATS_URL`, `DATABASE_URL` (and its database name, so each test has its own), the source
//! URLs and the OTLP endpoint become local servers; listen ports become free ports; a secret
//! volume's mount path becomes a folder holding the same files. Secrets an overlay leaves to the
//! operator (prod) are given test values. A setting that holds an address this module does not
//! know how to map fails the run, so a new one cannot slip past.

use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// An overlay, rendered.
pub struct Overlay {
    pub name: String,
    docs: Vec<Value>,
}

/// One container of a workload (Deployment, StatefulSet or Job) that runs a Tidings image.
pub struct Container {
    /// `Deployment/api/migrate`, `Deployment/api/api`, …
    pub workload: String,
    /// A Job's container or an init container: it must finish (successfully) before the
    /// services start.
    pub to_completion: bool,
    /// The command: the container's `command`, else the image's entrypoint, then `args`.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Secret volumes mounted into the container: (mount path, secret name).
    pub secret_mounts: Vec<(String, String)>,
    /// The readiness probe's path and container port.
    pub readiness: Option<(String, u16)>,
    /// The pod's name as Kubernetes would give it (`HOSTNAME`).
    pub pod_name: String,
    /// `resources.requests.cpu` as written (`500m`, `2`), if any.
    pub cpu_request: Option<String>,
}

impl Container {
    /// The value the container's environment gives `key`, as rendered.
    pub fn var(&self, key: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The Dockerfile's entrypoint per image name (`tidings-api` → its argv).
fn entrypoints() -> HashMap<String, Vec<String>> {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let mut stage = String::new();
    let mut out = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("FROM ")
            && let Some((_, name)) = rest.rsplit_once(" AS ")
        {
            stage = name.trim().to_owned();
        }
        if let Some(json) = line.strip_prefix("ENTRYPOINT ") {
            let argv: Vec<String> = serde_json::from_str(json.trim()).expect("ENTRYPOINT JSON");
            out.insert(format!("tidings-{stage}"), argv);
        }
    }
    out
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

impl Overlay {
    /// `kubectl kustomize deploy/k8s/overlays/<name>`, read as JSON (by the tools venv's YAML).
    pub fn render(name: &str) -> Overlay {
        let dir = repo().join("deploy/k8s/overlays").join(name);
        let rendered = crate::harness::succeeds(
            Command::new("kubectl").arg("kustomize").arg(&dir),
            &format!("rendering overlay {name}"),
        );
        let python = crate::harness::tool("python").expect("tools python");
        let mut child = Command::new(python)
            .args([
                "-c",
                "import sys, json, yaml; json.dump([d for d in yaml.safe_load_all(sys.stdin) if d], sys.stdout)",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(&rendered).expect("write yaml");
        }
        let json = child.wait_with_output().expect("yaml to json");
        assert!(json.status.success(), "the rendered YAML does not parse");
        let docs: Vec<Value> = serde_json::from_slice(&json.stdout).expect("json");
        Overlay {
            name: name.to_owned(),
            docs,
        }
    }

    pub fn docs(&self) -> &[Value] {
        &self.docs
    }

    /// The rendered object of this kind and name.
    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
    }

    /// A ConfigMap's or Secret's data as rendered (Secrets decoded); `None` if the overlay
    /// does not carry it.
    fn data(&self, kind: &str, name: &str) -> Option<HashMap<String, String>> {
        let doc = self.find(kind, name)?;
        let mut out = HashMap::new();
        for field in ["data", "stringData"] {
            if let Some(map) = doc[field].as_object() {
                for (k, v) in map {
                    let v = v.as_str().unwrap_or_default();
                    let v = if kind == "Secret" && field == "data" {
                        use base64::Engine as _;
                        let bytes = base64::engine::general_purpose::STANDARD
                            .decode(v.split_whitespace().collect::<String>())
                            .expect("secret data is base64");
                        String::from_utf8(bytes).expect("secret data is text")
                    } else {
                        v.to_owned()
                    };
                    out.insert(k.clone(), v);
                }
            }
        }
        Some(out)
    }

    /// Every container that runs a Tidings image, with its environment resolved. `secrets`
    /// gives the values of Secrets the overlay does not carry: (secret, key) → value.
    pub fn containers(&self, secrets: &HashMap<(String, String), String>) -> Vec<Container> {
        let entrypoints = entrypoints();
        let secret = |name: &str, key: &str| -> String {
            self.data("Secret", name)
                .and_then(|d| d.get(key).cloned())
                .or_else(|| secrets.get(&(name.to_owned(), key.to_owned())).cloned())
                .unwrap_or_else(|| panic!("{}: no value for secret {name}/{key}", self.name))
        };
        let mut out = Vec::new();
        for doc in &self.docs {
            let kind = doc["kind"].as_str().unwrap_or_default();
            if !matches!(kind, "Deployment" | "StatefulSet" | "Job") {
                continue;
            }
            let name = doc["metadata"]["name"].as_str().unwrap_or_default();
            let pod = &doc["spec"]["template"]["spec"];
            let volumes: HashMap<String, String> = pod["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| {
                    let source = v["secret"]["secretName"]
                        .as_str()
                        .or_else(|| v["configMap"]["name"].as_str())?;
                    Some((v["name"].as_str()?.to_owned(), source.to_owned()))
                })
                .collect();
            let init = pod["initContainers"].as_array().into_iter().flatten();
            let main = pod["containers"].as_array().into_iter().flatten();
            let containers = init
                .map(|c| (c, true))
                .chain(main.map(|c| (c, kind == "Job")));
            for (c, to_completion) in containers {
                let image = c["image"].as_str().unwrap_or_default();
                let image = image.rsplit('/').next().unwrap_or(image);
                let image = image.split(':').next().unwrap_or(image);
                let Some(entrypoint) = entrypoints.get(image) else {
                    continue;
                };
                let mut argv = if c["command"].is_array() {
                    strings(&c["command"])
                } else {
                    entrypoint.clone()
                };
                argv.extend(strings(&c["args"]));
                let mut env: Vec<(String, String)> = Vec::new();
                let mut set = |k: String, v: String| {
                    env.retain(|(key, _)| *key != k);
                    env.push((k, v));
                };
                for from in c["envFrom"].as_array().into_iter().flatten() {
                    let (kind, source) = if from["configMapRef"].is_object() {
                        ("ConfigMap", &from["configMapRef"])
                    } else {
                        ("Secret", &from["secretRef"])
                    };
                    let source = source["name"].as_str().unwrap_or_default();
                    let data = self.data(kind, source).unwrap_or_else(|| {
                        panic!("{name}: envFrom {kind} {source} is not rendered")
                    });
                    for (k, v) in data {
                        set(k, v);
                    }
                }
                let pod_name = match kind {
                    "StatefulSet" => format!("{name}-0"),
                    _ => format!("{name}-7d9f8b6c5d-x2x4z"),
                };
                for e in c["env"].as_array().into_iter().flatten() {
                    let k = e["name"].as_str().unwrap_or_default().to_owned();
                    let from = &e["valueFrom"];
                    let v = if let Some(v) = e["value"].as_str() {
                        v.to_owned()
                    } else if from["secretKeyRef"].is_object() {
                        let r = &from["secretKeyRef"];
                        secret(
                            r["name"].as_str().unwrap_or_default(),
                            r["key"].as_str().unwrap_or_default(),
                        )
                    } else if from["configMapKeyRef"].is_object() {
                        let r = &from["configMapKeyRef"];
                        let map = r["name"].as_str().unwrap_or_default();
                        self.data("ConfigMap", map)
                            .and_then(|d| d.get(r["key"].as_str().unwrap_or_default()).cloned())
                            .unwrap_or_else(|| panic!("{name}: {k} from ConfigMap {map}: missing"))
                    } else if from["fieldRef"]["fieldPath"] == "metadata.name" {
                        pod_name.clone()
                    } else {
                        panic!("{name}: {k}: a value source the smoke test does not know: {e}")
                    };
                    set(k, v);
                }
                let secret_mounts = c["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| {
                        let secret = volumes.get(m["name"].as_str()?)?;
                        Some((m["mountPath"].as_str()?.to_owned(), secret.clone()))
                    })
                    .collect();
                let probe = &c["readinessProbe"]["httpGet"];
                let readiness = probe["path"].as_str().map(|path| {
                    let port = match &probe["port"] {
                        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
                        Value::String(named) => c["ports"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .find(|p| p["name"] == named.as_str())
                            .and_then(|p| p["containerPort"].as_u64())
                            .and_then(|n| u16::try_from(n).ok()),
                        _ => None,
                    };
                    (
                        path.to_owned(),
                        port.unwrap_or_else(|| panic!("{name}: probe port")),
                    )
                });
                let container = c["name"].as_str().unwrap_or_default();
                out.push(Container {
                    workload: format!("{kind}/{name}/{container}"),
                    to_completion,
                    argv,
                    env,
                    secret_mounts,
                    readiness,
                    pod_name: pod_name.clone(),
                    cpu_request: c["resources"]["requests"]["cpu"]
                        .as_str()
                        .map(str::to_owned),
                });
            }
        }
        out
    }

    /// The data of a Secret or ConfigMap a volume mounts, rendered or given.
    fn secret_files(
        &self,
        name: &str,
        secrets: &HashMap<(String, String), String>,
    ) -> HashMap<String, String> {
        let rendered = self
            .data("Secret", name)
            .or_else(|| self.data("ConfigMap", name));
        rendered.unwrap_or_else(|| {
            secrets
                .iter()
                .filter(|((s, _), _)| s == name)
                .map(|((_, k), v)| (k.clone(), v.clone()))
                .collect()
        })
    }
}

/// Where the local servers are, for the addresses the manifests name.
pub struct Local {
    /// `host:port` of each NATS server.
    pub nats: Vec<String>,
    /// The test's database URL (host, port and database replaced, the manifest's user kept).
    pub database_url: String,
    /// `host:port` of the fake catalog.
    pub catalog: String,
    /// `host:port` where nothing listens (an OTLP collector that is not there).
    pub nowhere: String,
}

/// `scheme://host[:port]/rest` → (scheme, host[:port], rest).
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, after) = url.split_once("://")?;
    let end = after.find(['/', '?']).unwrap_or(after.len());
    Some((scheme, &after[..end], &after[end..]))
}

/// A manifest's Postgres URL on the test's server and database, with the manifest's user kept.
fn local_database_url(v: &str, local: &Local) -> String {
    let (scheme, authority, _) =
        split_url(v).unwrap_or_else(|| panic!("DATABASE_URL {v:?} is not a URL"));
    assert!(
        scheme.starts_with("postgres"),
        "DATABASE_URL scheme {scheme}"
    );
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    let (_, test_authority, test_rest) = split_url(&local.database_url).expect("test database URL");
    let host = test_authority
        .rsplit_once('@')
        .map_or(test_authority, |(_, h)| h);
    // The manifest's settings decide TLS (prod: PGSSLMODE=verify-full), not the test's URL.
    let (path, query) = test_rest.split_once('?').unwrap_or((test_rest, ""));
    let query: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !p.starts_with("sslmode="))
        .collect();
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{}", query.join("&"))
    };
    format!("{scheme}://{user}{host}{path}{query}")
}

/// Rewrites `container`'s environment for this machine (see the module's doc); returns the
/// map from container ports to the local ports they became.
pub fn localize(container: &mut Container, local: &Local) -> HashMap<u16, u16> {
    let mut ports = HashMap::new();
    for (k, v) in container.env.iter_mut() {
        let before = v.clone();
        match k.as_str() {
            "NATS_URL" => {
                let entries: Vec<&str> = v.split(',').map(str::trim).collect();
                *v = entries
                    .iter()
                    .enumerate()
                    .map(|(i, entry)| {
                        let (scheme, _, _) = split_url(entry)
                            .unwrap_or_else(|| panic!("NATS_URL entry {entry:?} is not a URL"));
                        format!("{scheme}://{}", local.nats[i % local.nats.len()])
                    })
                    .collect::<Vec<_>>()
                    .join(",");
            }
            "DATABASE_URL" => *v = local_database_url(v, local),
            // Written into mails' links for readers; no service connects to it.
            "TIDINGS_PUBLIC_URL" => continue,
            // The relay: this machine (nothing is mailed while the services start).
            "TIDINGS_SMTP_HOST" => *v = "127.0.0.1".into(),
            "TIDINGS_SOURCE_URL" | "TIDINGS_SOURCE_BATCH_URL" | "TIDINGS_ITEM_PAGE_URL" => {
                if let Some((_, _, rest)) = split_url(v) {
                    *v = format!("http://{}{rest}", local.catalog);
                }
            }
            "OTEL_EXPORTER_OTLP_ENDPOINT" => {
                if let Some((_, _, rest)) = split_url(v) {
                    *v = format!("http://{}{rest}", local.nowhere);
                }
            }
            key if key.ends_with("_LISTEN") => {
                let (_, port) = v
                    .rsplit_once(':')
                    .unwrap_or_else(|| panic!("{key}={v}: not host:port"));
                let port: u16 = port.parse().unwrap_or_else(|_| panic!("{key}={v}: port"));
                let free = crate::brokers::free_port().expect("free port");
                ports.insert(port, free);
                *v = format!("127.0.0.1:{free}");
            }
            _ => {}
        }
        // Anything else that names a host cannot be run here; say so rather than pass it on.
        let host = |authority: &str| {
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            host.rsplit_once(':').map_or(host, |(h, _)| h).to_owned()
        };
        if *v == before
            && let Some((_, authority, _)) = split_url(v)
            && !matches!(host(authority).as_str(), "127.0.0.1" | "localhost")
        {
            panic!(
                "{}: {k}={v} names {authority}, which the smoke test does not map to a local server",
                container.workload
            );
        }
    }
    ports
}

/// Writes each secret volume's files into `dir` and points the environment's paths there; a
/// Postgres URL given as a file (`DATABASE_URL_FILE`) is localized as [`localize`] does the
/// variable.
pub fn mount_secrets(
    container: &mut Container,
    overlay: &Overlay,
    secrets: &HashMap<(String, String), String>,
    dir: &Path,
    servers: &Local,
) {
    for (i, (mount, secret)) in container.secret_mounts.clone().into_iter().enumerate() {
        // One folder per container and volume: containers mount the same paths.
        let local = dir.join(format!(
            "{}-mount-{i}",
            container.workload.replace('/', "-")
        ));
        std::fs::create_dir_all(&local).expect("mount dir");
        for (key, value) in overlay.secret_files(&secret, secrets) {
            std::fs::write(local.join(&key), value).expect("secret file");
        }
        let local = local.display().to_string();
        for (k, v) in container.env.iter_mut() {
            if let Some(rest) = v
                .strip_prefix(mount.as_str())
                .filter(|rest| rest.starts_with('/'))
            {
                *v = format!("{local}{rest}");
                if k == "DATABASE_URL_FILE" {
                    let url = std::fs::read_to_string(&*v).expect("DATABASE_URL_FILE");
                    std::fs::write(&*v, local_database_url(url.trim_end(), servers))
                        .expect("DATABASE_URL_FILE");
                }
            }
        }
    }
}

impl Container {
    /// A secret setting's value, given as `key` or as a file `key_FILE` on a secret volume.
    pub fn secret_value(
        &self,
        key: &str,
        overlay: &Overlay,
        secrets: &HashMap<(String, String), String>,
    ) -> Option<String> {
        if let Some(v) = self.var(key) {
            return Some(v.to_owned());
        }
        let path = self.var(&format!("{key}_FILE"))?;
        let (mount, secret) = self
            .secret_mounts
            .iter()
            .find(|(mount, _)| path.starts_with(&format!("{mount}/")))?;
        let file = path[mount.len()..].trim_start_matches('/');
        overlay.secret_files(secret, secrets).remove(file)
    }
}
