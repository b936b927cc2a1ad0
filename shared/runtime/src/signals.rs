//! Shutdown on SIGTERM (Kubernetes) or Ctrl-C: one cancellation token every loop watches.

use crate::telemetry::Telemetry;
use std::future::Future;
use tokio_util::sync::CancellationToken;

/// A service binary's life: logs and traces as `name`, then `run` with a token that SIGTERM or
/// Ctrl-C cancels; traces still buffered are flushed after `run` returns.
pub async fn serve<F, Fut, E>(name: &'static str, run: F) -> Result<(), E>
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
{
    let _telemetry = Telemetry::init(name);
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    run(shutdown).await
}

/// Cancels `shutdown` on SIGTERM (Kubernetes) or Ctrl-C.
pub async fn cancel_on_signal(shutdown: CancellationToken) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down: finishing in-flight work");
    shutdown.cancel();
}
