//! Delivering one signed webhook (docs/webhooks.md): the endpoint guard, a slot among its host's,
//! one POST of the body exactly as the dispatcher signed it, and the answer classified into a
//! PushResult. The pusher holds no signing secret.
//!
//! Fairness: each receiver (the address its host resolves to, so not one per subdomain a client
//! registers) has `webhook_concurrency_per_host` slots ([`Webhooks::host_slot`]), taken before
//! the request starts and held until it ends, so a receiver that hangs holds its own slots only,
//! and requests to other receivers go on beside it. A request that waited for a slot past its
//! deadline or validity is not sent (reported `expired` or outlived, like any late push).

use crate::Request;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidings_domain::messages::{Ended, Outcome, PushResult, WebhookCall};
use tidings_domain::outbox::FailReason;
use tidings_domain::push::{classify_webhook, retry_after};
use tidings_endpoint_guard::Guard;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Settings;
use crate::deliver::{client, fresh, refused, result};

/// How much of a receiver's answer is kept in the attempt's record.
pub const MAX_RESPONSE_BODY: usize = 1024;

pub struct Webhooks {
    client: reqwest::Client,
    guard: Guard,
    per_host: usize,
    slots: Mutex<HashMap<SocketAddr, Arc<Semaphore>>>,
}

impl Webhooks {
    pub fn new(settings: &Settings) -> Result<Self, reqwest::Error> {
        let policy = Arc::new(settings.webhook_policy.clone());
        Ok(Webhooks {
            client: client(settings, &policy, settings.webhook_concurrency_per_host)?,
            guard: Guard::new(policy),
            per_host: settings.webhook_concurrency_per_host.max(1),
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// A slot among those of `call`'s receiver (the address its host resolves to, and the port:
    /// host names that resolve alike share them), waited for until the request's `deadline` at
    /// most. The worker takes it before one of its own slots, so requests waiting on a busy
    /// receiver hold none of the slots other receivers' requests need; and a request waits no
    /// longer than it may still be sent, so a burst to a hanging receiver leaves the consumer's
    /// window by its deadline, not after the hanging requests' timeouts. `None` for an endpoint
    /// the guard refuses (the delivery then says why) and past the deadline (then refused late).
    pub async fn host_slot(
        &self,
        call: &WebhookCall,
        deadline: DateTime<Utc>,
    ) -> Option<OwnedSemaphorePermit> {
        // Just past the deadline, so the delivery that follows finds the request late.
        let left = (deadline - Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(1);
        let slot = async {
            let (_, receiver) = self.guard.check_at(&call.url).await.ok()?;
            // Never closed.
            self.slots_of(receiver).acquire_owned().await.ok()
        };
        tokio::time::timeout(left, slot).await.ok()?
    }

    fn slots_of(&self, receiver: SocketAddr) -> Arc<Semaphore> {
        // The map holds no invariant a panicking holder could break.
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        // Receivers whose slots are all free are forgotten once many are known.
        if slots.len() >= 4096 {
            let per_host = self.per_host;
            slots.retain(|_, s| s.available_permits() < per_host);
        }
        slots
            .entry(receiver)
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_host)))
            .clone()
    }

    pub async fn deliver(&self, req: &Request, call: &WebhookCall) -> PushResult {
        let started = Instant::now();
        let url = match self.guard.check(&call.url).await {
            Ok(url) => url,
            Err(e) => {
                return refused(req, FailReason::EndpointRefused, e.to_string(), started);
            }
        };
        if let Err(late) = fresh(req, Utc::now(), started) {
            return *late;
        }
        let sent = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", req.outbox_id.to_string())
            .header("webhook-timestamp", call.timestamp.to_string())
            .header("webhook-signature", call.signature.as_str())
            .body(call.body.clone())
            .send()
            .await;
        match sent {
            Ok(resp) => answered(req, resp, started).await,
            Err(e) => {
                // As for a push: only a connection that never opened proves the webhook did not
                // arrive.
                let ended = Ended::Transient {
                    retry_after: None,
                    maybe_delivered: !e.is_connect(),
                };
                PushResult {
                    error: Some(format!(
                        "{}: {}",
                        if e.is_timeout() { "timeout" } else { "request" },
                        crate::deliver::redacted(e)
                    )),
                    ..result(req, ended, started)
                }
            }
        }
    }
}

/// What the receiver's answer means; when it is not a 2xx, its body (up to
/// [`MAX_RESPONSE_BODY`]) goes into the attempt's record: the receiver's own words on why.
async fn answered(req: &Request, mut resp: reqwest::Response, started: Instant) -> PushResult {
    let status = resp.status().as_u16();
    let outcome = classify_webhook(status);
    let retry = (resp.headers().get("retry-after"))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| retry_after(v, Utc::now()));
    let mut text = Vec::new();
    while outcome != Outcome::Delivered
        && let Ok(Some(chunk)) = resp.chunk().await
    {
        let room = MAX_RESPONSE_BODY - text.len();
        text.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if text.len() >= MAX_RESPONSE_BODY {
            break;
        }
    }
    let said = String::from_utf8_lossy(&text).trim().to_owned();
    let ended = Ended::answered(outcome, None, retry, Some(FailReason::WebhookRejected));
    PushResult {
        http_status: Some(status),
        error: (outcome != Outcome::Delivered).then(|| format!("HTTP {status}: {said}")),
        ..result(req, ended, started)
    }
}
