//! nats-servers of a test's own: one ([`PrivateNats`]), optionally with a configuration file
//! (authentication, TLS), or a JetStream cluster of three on 127.0.0.1 ([`NatsCluster`]), for
//! tests that kill, restart or lock down the broker without disturbing the tests that share the
//! stack's server.

use crate::harness::{HarnessError, stack};
use std::path::PathBuf;
use std::time::Duration;
use tidings_bus::connection::servers;
use uuid::Uuid;

/// A client connected to `url` (one server or a comma-separated list), or the reason none
/// answered.
pub async fn client_of(url: &str) -> Result<async_nats::Client, HarnessError> {
    let servers = servers(url).map_err(|e| HarnessError::Nats(e.to_string()))?;
    async_nats::connect(servers)
        .await
        .map_err(|e| HarnessError::Nats(format!("{url}: {e}")))
}

/// A nats-server of one test's own (JetStream on, its own port and storage).
pub struct PrivateNats {
    pub url: String,
    port: u16,
    monitor: u16,
    dir: PathBuf,
    /// Server configuration (the `-c` file): authorization, TLS, a cluster block.
    config: Option<String>,
    /// Flags after the common ones (a cluster node's name, routes).
    args: Vec<String>,
    child: Option<std::process::Child>,
}

/// A port of 127.0.0.1 nothing listens on now, for a server another process will bind.
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`), where every outgoing
/// connection gets its local port: a port the kernel handed out as free from that range could
/// be taken by any test's connection before the server bound it, and a service that could not
/// bind its ops endpoint never became ready (a test timed out on it).
pub fn free_port() -> Result<u16, HarnessError> {
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    if let Some(span) = ephemeral
        .checked_sub(FIRST_FIXED_PORT)
        .filter(|s| *s > 1000)
    {
        let mut given = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..100 {
            let offset = Uuid::new_v4().as_u128() % u128::from(span);
            let port = FIRST_FIXED_PORT + u16::try_from(offset).unwrap_or(0);
            if !given.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                given.insert(port);
                return Ok(port);
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| HarnessError::Nats(format!("no free port: {e}")))
}

/// Where [`free_port`] starts looking: above the ports well-known servers use.
const FIRST_FIXED_PORT: u16 = 20_000;

/// The ports [`free_port`] has handed out in this process: a port is free until its server binds
/// it, so a process starting several (a pipeline's api and ops ports, a cluster's nodes) could
/// otherwise be given one port twice, and the second server to bind it exits.
static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Up to three tries of `start`, each choosing its ports anew. A port [`free_port`] found free
/// can be taken by another test's connection before the server binds it, and the server then
/// exits; the error, when every try failed, carries each try's (with the servers' logs).
async fn on_fresh_ports<T, F, Fut>(what: &str, mut start: F) -> Result<T, HarnessError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, HarnessError>>,
{
    let mut failures = Vec::new();
    for _ in 0..3 {
        match start().await {
            Ok(started) => return Ok(started),
            Err(e) => {
                eprintln!("{what} did not start, starting it again on other ports: {e}");
                failures.push(e.to_string());
            }
        }
    }
    Err(HarnessError::Nats(format!(
        "{what} did not start in three tries:\n{}",
        failures.join("\n---\n")
    )))
}

impl PrivateNats {
    /// A port and storage folder for a server that is not running yet ([`PrivateNats::start`]).
    pub fn reserve() -> Result<Self, HarnessError> {
        let port = free_port()?;
        let dir = std::env::temp_dir().join(format!("tidings-nats-{}", Uuid::new_v4().simple()));
        Ok(PrivateNats {
            url: format!("nats://127.0.0.1:{port}"),
            port,
            monitor: free_port()?,
            dir,
            config: None,
            args: Vec::new(),
            child: None,
        })
    }

    /// Reserves and starts a server.
    pub async fn started() -> Result<Self, HarnessError> {
        Self::started_on_free_ports(None).await
    }

    /// Reserves and starts a server with this configuration file (its `listen`, `jetstream` and
    /// monitoring settings are set by flags, which take precedence).
    pub async fn with_config(config: &str) -> Result<Self, HarnessError> {
        Self::started_on_free_ports(Some(config)).await
    }

    async fn started_on_free_ports(config: Option<&str>) -> Result<Self, HarnessError> {
        on_fresh_ports("nats-server", || async {
            let mut n = Self::reserve()?;
            n.config = config.map(str::to_owned);
            n.start().await.map(|()| n)
        })
        .await
    }

    /// Starts the server (again, on the same port and storage) and waits until JetStream is up.
    /// Its output is appended to `nats.log` in its storage folder ([`PrivateNats::log`]).
    pub async fn start(&mut self) -> Result<(), HarnessError> {
        let bin = stack()?.nats_server.clone();
        let io = |e: std::io::Error| HarnessError::Nats(format!("{}: {e}", self.dir.display()));
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let mut command = std::process::Command::new(&bin);
        if let Some(config) = &self.config {
            let file = self.dir.join("nats.conf");
            std::fs::write(&file, config).map_err(io)?;
            command.arg("-c").arg(file);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_file())
            .map_err(io)?;
        let child = command
            .args(["-js", "-a", "127.0.0.1"])
            .args([
                "-p",
                &self.port.to_string(),
                "-m",
                &self.monitor.to_string(),
            ])
            .arg("-sd")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| HarnessError::Nats(format!("starting {bin}: {e}")))?;
        self.child = Some(child);
        let health = format!(
            "http://127.0.0.1:{}/healthz?js-enabled-only=true",
            self.monitor
        );
        for _ in 0..200 {
            self.check_running()?;
            if let Ok(r) = reqwest::get(&health).await
                && r.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(HarnessError::Nats(format!(
            "private nats-server on port {} did not become healthy:\n{}",
            self.port,
            self.log()
        )))
    }

    fn log_file(&self) -> PathBuf {
        self.dir.join("nats.log")
    }

    /// What the server has printed (its last 40 lines), for a failure's message.
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.log_file()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// An error naming the exit and the log if the server was started and has exited since
    /// (a port taken between [`free_port`] and its bind, say).
    fn check_running(&mut self) -> Result<(), HarnessError> {
        let exited = match self.child.as_mut().map(std::process::Child::try_wait) {
            Some(Ok(Some(status))) => status.to_string(),
            Some(Err(e)) => e.to_string(),
            Some(Ok(None)) | None => return Ok(()),
        };
        Err(HarnessError::Nats(format!(
            "nats-server on port {} exited ({exited}):\n{}",
            self.port,
            self.log()
        )))
    }

    /// `kill -9`: JetStream loses what it had not written to disk yet, as in a real crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub async fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill();
        self.start().await
    }

    pub async fn client(&self) -> Result<async_nats::Client, HarnessError> {
        client_of(&self.url).await
    }

    /// The server's process id while it runs (benchmarks read its memory).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Three nats-servers routed to each other as one JetStream cluster, as production runs it.
pub struct NatsCluster {
    pub nodes: Vec<PrivateNats>,
    /// Each node's server name, as JetStream reports leaders and replicas.
    pub names: Vec<String>,
}

impl NatsCluster {
    /// Starts three nodes and waits until the cluster has a JetStream meta leader (streams can
    /// be created).
    pub async fn started() -> Result<Self, HarnessError> {
        Self::with_config(None).await
    }

    /// [`NatsCluster::started`], each node with `config` (e.g. users and their permissions; a
    /// `no_auth_user` lets this harness's own client in).
    ///
    /// A node that lost its port (see [`on_fresh_ports`]) leaves two that elect a leader but can
    /// never place a stream's three replicas ("no suitable peers for placement"), so a cluster
    /// that does not form is stopped and started again on other ports.
    pub async fn with_config(config: Option<&str>) -> Result<Self, HarnessError> {
        on_fresh_ports("NATS cluster", || async {
            let ports = [free_port()?, free_port()?, free_port()?];
            Self::try_start(config, ports).await
        })
        .await
    }

    /// One try at starting a cluster whose nodes route on `cluster_ports`: an error as soon as
    /// a node exits, or when the cluster has not formed within 20 s.
    pub async fn try_start(
        config: Option<&str>,
        cluster_ports: [u16; 3],
    ) -> Result<Self, HarnessError> {
        let mut nodes = Vec::new();
        for _ in cluster_ports {
            let mut node = PrivateNats::reserve()?;
            node.config = config.map(str::to_owned);
            nodes.push(node);
        }
        let name = format!("tidings-{}", &Uuid::new_v4().simple().to_string()[..8]);
        let names: Vec<String> = (0..nodes.len()).map(|i| format!("{name}-n{i}")).collect();
        for (i, node) in nodes.iter_mut().enumerate() {
            let routes: Vec<String> = cluster_ports
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, p)| format!("nats://127.0.0.1:{p}"))
                .collect();
            node.args = vec![
                "-n".into(),
                names[i].clone(),
                "--cluster_name".into(),
                name.clone(),
                "--cluster".into(),
                format!("nats://127.0.0.1:{}", cluster_ports[i]),
                "--routes".into(),
                routes.join(","),
            ];
        }
        // Each node waits for its routes before JetStream reports healthy, so start them together.
        let starts = nodes.iter_mut().map(PrivateNats::start);
        let started: Result<Vec<()>, HarnessError> = futures::future::join_all(starts)
            .await
            .into_iter()
            .collect();
        let mut cluster = NatsCluster { nodes, names };
        started?;
        cluster.wait_formed().await?;
        cluster.wait_for_meta_leader().await?;
        Ok(cluster)
    }
    /// Every node's URL, comma-separated: what `NATS_URL` is given in production.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.url.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The node whose server name JetStream reported (a stream's leader, say).
    pub fn node(&mut self, server_name: &str) -> Option<&mut PrivateNats> {
        let i = self.names.iter().position(|n| n == server_name)?;
        self.nodes.get_mut(i)
    }

    /// A client of the whole cluster, connected the way the services connect.
    pub async fn client(&self) -> Result<async_nats::Client, HarnessError> {
        client_of(&self.url()).await
    }

    /// Waits until one node leads the JetStream meta group and sees both others current: what
    /// placing a stream's three replicas needs. A node that exits ends the wait at once.
    async fn wait_formed(&mut self) -> Result<(), HarnessError> {
        let started = std::time::Instant::now();
        let mut seen = String::new();
        while started.elapsed() < Duration::from_secs(20) {
            for node in &mut self.nodes {
                node.check_running()?;
            }
            seen.clear();
            for (node, name) in self.nodes.iter().zip(&self.names) {
                let meta = meta_cluster(node.monitor).await;
                let leads = meta["leader"].as_str() == Some(name.as_str());
                let peers = meta["replicas"].as_array().map_or(&[][..], Vec::as_slice);
                if leads && peers.len() == 2 && peers.iter().all(|p| p["current"] == true) {
                    return Ok(());
                }
                seen.push_str(&format!("\n{name}: {meta}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let logs: Vec<String> = (self.names.iter().zip(&self.nodes))
            .map(|(name, node)| format!("{name}:\n{}", node.log()))
            .collect();
        Err(HarnessError::Nats(format!(
            "no node led the meta group with both peers current within 20 s; each node's view:{seen}\n{}",
            logs.join("\n")
        )))
    }

    async fn wait_for_meta_leader(&self) -> Result<(), HarnessError> {
        let js = async_nats::jetstream::new(self.client().await?);
        let mut last = String::new();
        for _ in 0..200 {
            match js.query_account().await {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(HarnessError::Nats(format!(
            "the cluster at {} elected no JetStream leader: {last}",
            self.url()
        )))
    }
}

/// A node's view of the JetStream meta group (`/jsz`'s `meta_cluster`), or null while it has
/// none to give.
async fn meta_cluster(monitor: u16) -> serde_json::Value {
    let url = format!("http://127.0.0.1:{monitor}/jsz");
    let Ok(response) = reqwest::get(&url).await else {
        return serde_json::Value::Null;
    };
    let text = response.text().await.unwrap_or_default();
    serde_json::from_str::<serde_json::Value>(&text)
        .map(|v| v["meta_cluster"].clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_never_given_one_port_twice() {
        // 2,000 of the ~12,000 ports below the ephemeral range: drawn at random without the
        // record of what was handed out, two would all but surely be the same.
        let ports: Vec<u16> = (0..2000).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::HashSet<&u16> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
    }

    #[test]
    fn a_free_port_is_bindable_and_outside_the_ephemeral_range() {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let low: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
        let ports: std::collections::HashSet<u16> = (0..20).map(|_| free_port().unwrap()).collect();
        assert!(ports.len() > 10, "spread: {ports:?}");
        for port in ports {
            // (A kernel whose ephemeral range starts low gets the fallback: any free port.)
            if low > FIRST_FIXED_PORT + 1000 {
                assert!((FIRST_FIXED_PORT..low).contains(&port), "{port} vs {low}");
            }
            std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }
}
