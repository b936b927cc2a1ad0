//! Shutdown on SIGTERM (Kubernetes) or Ctrl-C: one cancellation token every loop watches.

use tokio_util::sync::CancellationToken;

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
