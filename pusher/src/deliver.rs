//! Delivering one PushRequest: deadline, endpoint guard, encryption, VAPID, one HTTPS POST, and
//! the answer classified into a PushResult. Never panics and never retries by itself: retries are
//! the dispatcher's decision.

use crate::Request;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidings_domain::messages::{Ended, Outcome, PushResult, Subscription, Target};
use tidings_domain::outbox::FailReason;
use tidings_domain::validity;
use tidings_endpoint_guard::{EndpointPolicy, Guard, GuardedResolver};
use tidings_webpush::encryption::{self, EncryptError, UaKeys};
use tidings_webpush::vapid::VapidSigner;

use crate::config::Settings;
use crate::email::Mails;
use crate::webhook::Webhooks;
use tidings_domain::push::{classify, retry_after};

/// How much of an error response we read, for the log and `last_error`.
const MAX_ERROR_BODY: usize = 4 * 1024;

pub struct Deliverer {
    client: reqwest::Client,
    vapid: Arc<VapidSigner>,
    guard: Guard,
    webhooks: Webhooks,
    mails: Mails,
}

pub(crate) fn result(req: &Request, ended: impl Into<Ended>, started: Instant) -> PushResult {
    PushResult {
        // Milliseconds past `u64` are 584 million years.
        latency_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        ..PushResult::new(req.outbox_id, req.attempt, ended)
    }
}

pub(crate) fn refused(
    req: &Request,
    reason: FailReason,
    error: String,
    started: Instant,
) -> PushResult {
    PushResult {
        error: Some(error),
        ..result(
            req,
            Ended::Permanent {
                refused: Some(reason),
                maybe_delivered: false,
            },
            started,
        )
    }
}

/// Not sent: the notification stopped being current at `until`, before it could go out.
fn outlived(
    req: &Request,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
    started: Instant,
) -> PushResult {
    let ended = Ended::Expired {
        outlived: true,
        maybe_delivered: false,
    };
    PushResult {
        error: Some(format!(
            "its validity ran out {} ms ago, at {until}; not sent",
            (now - until).num_milliseconds()
        )),
        ..result(req, ended, started)
    }
}

/// An HTTP client for one channel: pooled connections, HTTP/2 where the server offers it (ALPN),
/// connect and total timeouts, no redirects, and a resolver that refuses what `policy` refuses.
/// No proxy from the environment (`HTTPS_PROXY`, `ALL_PROXY`): a proxy resolves the name itself,
/// so the guarded resolver would never see the address connected to.
pub(crate) fn client(
    settings: &Settings,
    policy: &Arc<EndpointPolicy>,
    idle_per_host: usize,
) -> Result<reqwest::Client, reqwest::Error> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(settings.connect_timeout)
        .timeout(settings.http_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .pool_max_idle_per_host(idle_per_host)
        .dns_resolver(GuardedResolver::new(policy.clone()));
    let roots = (settings.extra_roots.iter())
        .map(|pem| reqwest::Certificate::from_pem(pem))
        .collect::<Result<Vec<_>, _>>()?;
    if !roots.is_empty() {
        builder = builder.tls_certs_merge(roots);
    }
    builder.build()
}

/// A transport error as attempts and logs keep it: without the URL, whose path and query may
/// carry the receiver's tokens (`/hooks/<secret>?key=…`), and with its causes, which say what
/// went wrong (`connection refused`).
pub(crate) fn redacted(e: reqwest::Error) -> String {
    tidings_runtime::telemetry::with_causes(&e.without_url())
}

impl Deliverer {
    pub fn new(settings: &Settings) -> Result<Self, reqwest::Error> {
        let policy = Arc::new(settings.policy.clone());
        Ok(Deliverer {
            client: client(settings, &policy, settings.concurrency)?,
            vapid: settings.vapid.clone(),
            guard: Guard::new(policy),
            webhooks: Webhooks::new(settings)?,
            mails: Mails::new(settings),
        })
    }

    /// For a webhook, a slot among its host's (see [`Webhooks::host_slot`]); for a mail, among
    /// its domain's; a push service needs none.
    pub async fn host_slot(&self, req: &Request) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match &req.target {
            Target::WebPush(_) => None,
            Target::Webhook(call) => self.webhooks.host_slot(call, req.deadline).await,
            Target::Email(call) => self.mails.domain_slot(call, req.deadline).await,
        }
    }

    pub async fn deliver(&self, req: &Request) -> PushResult {
        match &req.target {
            Target::WebPush(sub) => self.web_push(req, sub).await,
            Target::Webhook(call) => self.webhooks.deliver(req, call).await,
            Target::Email(call) => self.mails.deliver(req, call).await,
        }
    }

    async fn web_push(&self, req: &Request, sub: &Subscription) -> PushResult {
        let started = Instant::now();
        let ready = match self.prepare(sub, req).await {
            Ok(ready) => ready,
            Err((reason, error)) => return refused(req, reason, error, started),
        };
        // Checked last, right before the POST, so nothing above (DNS, encryption) can stretch
        // the freshness bound.
        let ttl = match fresh(req, Utc::now(), started) {
            Ok(ttl) => ttl,
            Err(late) => return *late,
        };
        if let Some(location) = &req.recall
            && let Some(status) = self.recall(req, &ready.url, location).await
        {
            return PushResult {
                http_status: Some(status),
                ..result(req, Outcome::Recalled, started)
            };
        }
        let sent = self
            .client
            .post(ready.url)
            .header("TTL", ttl.to_string())
            .header("Urgency", req.urgency.as_str())
            .header("Topic", req.topic.as_str())
            .header("Content-Encoding", "aes128gcm")
            .header("Content-Type", "application/octet-stream")
            .header("Authorization", ready.authorization)
            .body(ready.body)
            .send()
            .await;
        match sent {
            Ok(resp) => answered(req, resp, &ready.host, started).await,
            Err(e) => {
                let what = if e.is_timeout() {
                    "timeout"
                } else if e.is_connect() {
                    "connect"
                } else {
                    "request"
                };
                // Only a connection that never opened proves the request did not arrive; after
                // that, a timeout or a broken exchange may follow an accepted push.
                let ended = Ended::Transient {
                    retry_after: None,
                    maybe_delivered: !e.is_connect(),
                };
                PushResult {
                    error: Some(format!("{what}: {}", redacted(e))),
                    ..result(req, ended, started)
                }
            }
        }
    }

    /// Asks the push service to delete the message `location` names (RFC 8030 §6.3: the
    /// notification a withdrawal withdraws), which it does only while the message still waits
    /// for its device; returns the status of a deletion that happened. Only a resource of the
    /// endpoint's own origin is asked, with the same VAPID authorization a push carries; any
    /// other answer (already fetched, expired, deletion not supported, no answer) leaves the
    /// withdrawal to be sent.
    async fn recall(&self, req: &Request, endpoint: &reqwest::Url, location: &str) -> Option<u16> {
        let id = req.outbox_id;
        let url = match endpoint.join(location) {
            Ok(url) if url.origin() == endpoint.origin() => url,
            _ => {
                tracing::warn!(outbox_id = %id, location, "not deleting a message outside its endpoint's origin; sending the withdrawal");
                return None;
            }
        };
        let authorization = self.vapid.authorization(&url, Utc::now()).ok()?;
        let answer = self
            .client
            .delete(url)
            .header("Authorization", authorization)
            .send()
            .await;
        match answer {
            Ok(resp) if resp.status().is_success() => {
                tracing::info!(outbox_id = %id, location, "the withdrawn message was deleted before its device fetched it; the withdrawal is not sent");
                Some(resp.status().as_u16())
            }
            Ok(resp) => {
                tracing::info!(outbox_id = %id, location, http_status = resp.status().as_u16(), "the withdrawn message was not deleted (fetched or gone already); sending the withdrawal");
                None
            }
            Err(e) => {
                tracing::info!(outbox_id = %id, location, error = %e, "deleting the withdrawn message failed; sending the withdrawal");
                None
            }
        }
    }

    /// The checked endpoint, the encrypted body and the VAPID authorization; or why the request
    /// cannot be sent at all.
    async fn prepare(
        &self,
        sub: &Subscription,
        req: &Request,
    ) -> Result<Ready, (FailReason, String)> {
        let url = (self.guard.check(&sub.endpoint).await)
            .map_err(|e| (FailReason::EndpointRefused, e.to_string()))?;
        let host = url.host_str().unwrap_or_default().to_owned();
        let keys = UaKeys::parse(&sub.p256dh, &sub.auth)
            .map_err(|e| (FailReason::PushRejected, format!("subscription keys: {e}")))?;
        let body = encryption::encrypt(&keys, req.payload.json()).map_err(|e| match e {
            EncryptError::TooLarge(_) => (FailReason::PayloadTooLarge, e.to_string()),
            e => (FailReason::PushRejected, e.to_string()),
        })?;
        let authorization = (self.vapid.authorization(&url, Utc::now()))
            .map_err(|e| (FailReason::VapidRejected, e.to_string()))?;
        Ok(Ready {
            url,
            host,
            body,
            authorization,
        })
    }
}

/// The request's TTL if it may still be sent `now`, or the result of one that is too late. The
/// deadline is the freshness bound: the value in the request was re-checked at most the
/// dispatcher's TIDINGS_PUSH_DEADLINE before it, and the notification is current until its
/// `valid_until`.
pub(crate) fn fresh(
    req: &Request,
    now: DateTime<Utc>,
    started: Instant,
) -> Result<u32, Box<PushResult>> {
    let ttl = match req.payload.valid_until() {
        Some(until) => match validity::ttl(until, now, Duration::from_secs(req.ttl.into())) {
            Some(ttl) => ttl,
            None => return Err(Box::new(outlived(req, until, now, started))),
        },
        None => req.ttl,
    };
    if now > req.deadline {
        return Err(Box::new(PushResult {
            error: Some(format!(
                "{} ms past its deadline (its re-check is too old); not sent",
                (now - req.deadline).num_milliseconds()
            )),
            ..result(req, Outcome::Expired, started)
        }));
    }
    Ok(ttl)
}

/// A push ready to send.
struct Ready {
    url: reqwest::Url,
    host: String,
    body: Vec<u8>,
    authorization: String,
}

/// What the push service's answer means: its outcome, its message id (`Location`), when to try
/// again (`Retry-After`) and, when it refused, the start of its body.
async fn answered(
    req: &Request,
    mut resp: reqwest::Response,
    host: &str,
    started: Instant,
) -> PushResult {
    let status = resp.status().as_u16();
    let outcome = classify(status, host);
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let message_id = header("location");
    let retry = header("retry-after").and_then(|v| retry_after(&v, Utc::now()));
    let mut error = None;
    if outcome != Outcome::Delivered {
        let mut text = Vec::new();
        while let Ok(Some(chunk)) = resp.chunk().await {
            text.extend_from_slice(&chunk[..chunk.len().min(MAX_ERROR_BODY - text.len())]);
            if text.len() >= MAX_ERROR_BODY {
                break;
            }
        }
        error = Some(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&text).trim()
        ));
    }
    if matches!(status, 401 | 403) {
        tracing::error!(
            outbox_id = %req.outbox_id,
            host = %host,
            http_status = status,
            "push service rejected our VAPID credentials: check TIDINGS_VAPID_PRIVATE_KEY and TIDINGS_VAPID_SUBJECT"
        );
    }
    PushResult {
        http_status: Some(status),
        error,
        ..result(
            req,
            Ended::answered(outcome, message_id, retry, None),
            started,
        )
    }
}
