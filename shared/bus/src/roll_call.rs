//! A roll call of the running pushers over core NATS: the api asks on `<prefix>.ops.pushers` and
//! every pusher answers with who it is and the VAPID public key it signs with, so `doctor` can
//! tell a key pair split between the api (which hands browsers the public key) and any pusher
//! (which signs with the private one) — the fault that makes every push service answer 401/403.

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tidings_domain::subjects::Subjects;
use tokio_util::sync::CancellationToken;

/// The roll call's subject under the prefix.
pub const SUBJECT: &str = "ops.pushers";

/// One pusher's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Present {
    /// The pusher's instance (its host name).
    pub instance: String,
    pub version: String,
    pub vapid_public_key: String,
}

fn subject(subjects: &Subjects) -> String {
    format!("{}.{SUBJECT}", subjects.prefix())
}

/// Answers every roll call until `shutdown` (`crate::respond`).
pub async fn answer(
    client: async_nats::Client,
    subjects: Subjects,
    present: Present,
    shutdown: CancellationToken,
) {
    let body: Vec<u8> = match serde_json::to_vec(&present) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the roll-call answer");
            return;
        }
    };
    crate::respond::serve(
        client,
        subject(&subjects),
        None,
        "the roll call",
        shutdown,
        |_| std::future::ready(body.clone()),
    )
    .await;
}

#[derive(Debug, thiserror::Error)]
#[error("roll call on {subject}: {source}")]
pub struct RollCallError {
    pub subject: String,
    #[source]
    pub source: crate::Cause,
}

/// Calls the roll and collects the answers that arrive within `wait`, in instance order. An
/// answer that cannot be read is skipped.
pub async fn call(
    client: &async_nats::Client,
    subjects: &Subjects,
    wait: Duration,
) -> Result<Vec<Present>, RollCallError> {
    let subject = subject(subjects);
    let error = |source: crate::Cause| RollCallError {
        subject: subject.clone(),
        source,
    };
    let inbox = client.new_inbox();
    let mut answers = client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| error(e.into()))?;
    client
        .publish_with_reply(subject.clone(), inbox, Vec::new().into())
        .await
        .map_err(|e| error(e.into()))?;
    client.flush().await.map_err(|e| error(e.into()))?;
    let mut present = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(m)) = tokio::time::timeout_at(deadline, answers.next()).await {
        if let Ok(p) = serde_json::from_slice::<Present>(&m.payload) {
            present.push(p);
        }
    }
    present.sort_by(|a, b| a.instance.cmp(&b.instance));
    Ok(present)
}
