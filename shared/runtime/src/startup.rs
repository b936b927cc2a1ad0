//! Start-up that waits for its dependencies instead of exiting.
//!
//! A service that exits because NATS or Postgres is not there yet is restarted by Kubernetes
//! with a growing back-off (CrashLoopBackOff), which adds minutes to an outage that may have
//! lasted seconds. Instead every service serves `/livez` and `/readyz` first, then connects and
//! prepares (streams, consumers) with [`retry`] — [`start`] does it for the [`Dependency`]s a
//! service names (`tidings_store::dependency`, `tidings_bus::streams::connect`): each failure
//! is logged with what is missing and why, `/readyz` answers 503 with the same text, and the next try comes after a back-off that
//! doubles up to [`MAX_DELAY`]. SIGTERM ends the wait.

use crate::ops::{self, Check, Probes, Starting};
use futures::future::BoxFuture;
use std::fmt::Display;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Something a service needs before it can work (Postgres, NATS and its streams): how
/// `/readyz` checks it, and how start-up waits for it. `tidings_store::dependency` and
/// `tidings_bus::streams::connect` make them.
pub struct Dependency {
    pub check: Check,
    pub wait: Box<dyn FnOnce(Starting, CancellationToken) -> BoxFuture<'static, Option<()>> + Send>,
}

/// Serves the ops endpoint on `listen` (unless `None`) with a readiness check per dependency,
/// then waits for each dependency in order. `None` if `shutdown` came first; otherwise the
/// probes, now answering ready.
pub async fn start(
    listen: Option<SocketAddr>,
    dependencies: Vec<Dependency>,
    shutdown: &CancellationToken,
) -> Option<Probes> {
    let mut probes = Probes::default();
    let mut waits = Vec::with_capacity(dependencies.len());
    for d in dependencies {
        probes = probes.with_check(d.check);
        waits.push(d.wait);
    }
    if let Some(listen) = listen {
        ops::spawn(listen, probes.clone(), shutdown.clone());
    }
    for wait in waits {
        if wait(probes.starting.clone(), shutdown.clone())
            .await
            .is_none()
        {
            tracing::info!("stopped while starting");
            return None;
        }
    }
    probes.starting.done();
    Some(probes)
}

pub const FIRST_DELAY: Duration = Duration::from_millis(200);
pub const MAX_DELAY: Duration = Duration::from_secs(5);
/// How long one try may take before it counts as failed.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);

/// Runs `step` until it succeeds; `None` if `shutdown` came first.
pub async fn retry<T, E, F, Fut>(
    what: &str,
    starting: &Starting,
    shutdown: &CancellationToken,
    mut step: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: Display,
{
    let mut delay = FIRST_DELAY;
    let mut failures: u32 = 0;
    loop {
        if shutdown.is_cancelled() {
            return None;
        }
        starting.waiting_for(what.to_owned());
        let attempt = tokio::select! {
            () = shutdown.cancelled() => return None,
            r = tokio::time::timeout(ATTEMPT_TIMEOUT, step()) => r,
        };
        let attempt = match attempt {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {ATTEMPT_TIMEOUT:?}")),
        };
        match attempt {
            Ok(v) => {
                if failures > 0 {
                    tracing::info!(what, failures, "start-up: available now");
                }
                return Some(v);
            }
            Err(e) => {
                failures += 1;
                starting.waiting_for(format!("{what}: {e}"));
                tracing::warn!(
                    what,
                    error = %e,
                    failures,
                    // Milliseconds past `u64` are 584 million years.
                    retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "start-up: not available yet; retrying"
                );
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_DELAY);
    }
}

/// Waits until the client is connected (it connects in the background:
/// `tidings_bus::connection`).
pub async fn wait_for_nats(
    client: &async_nats::Client,
    url: &str,
    starting: &Starting,
    shutdown: &CancellationToken,
) -> Option<()> {
    let what = format!("NATS at {url} (NATS_URL)");
    retry(&what, starting, shutdown, || async {
        match client.connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            state => Err(format!("not connected ({state:?})")),
        }
    })
    .await
}
