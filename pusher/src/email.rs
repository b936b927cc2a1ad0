//! Submitting one mail (docs/email.md): a slot among its destination domain's, then the
//! operator's relay on a pooled connection, and the relay's answer as a PushResult. The mail
//! comes written and DKIM-signed by the dispatcher: the pusher holds no key.
//!
//! Fairness as for webhooks: each destination domain has `email_concurrency_per_domain` slots,
//! so a slow domain behind the relay holds only its own. The whole submission is bounded by the
//! request timeout (TIDINGS_PUSH_HTTP_TIMEOUT), which the dispatcher's lease is sized for: a
//! relay slower than that is reported as no answer, maybe delivered.

use crate::Request;
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidings_domain::messages::{Ended, MailCall, PushResult};
use tidings_domain::outbox::FailReason;
use tidings_email::relay::Relay;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::Settings;
use crate::deliver::{fresh, refused, result};

pub struct Mails {
    relay: Option<Arc<Relay>>,
    per_domain: usize,
    timeout: Duration,
    slots: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Mails {
    pub fn new(settings: &Settings) -> Self {
        Mails {
            relay: settings.relay.clone(),
            per_domain: settings.email_concurrency_per_domain.max(1),
            timeout: settings.http_timeout,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// A slot among those of `call`'s destination domain, waited for until the request's
    /// `deadline` at most (see `Webhooks::host_slot`).
    pub async fn domain_slot(
        &self,
        call: &MailCall,
        deadline: DateTime<Utc>,
    ) -> Option<OwnedSemaphorePermit> {
        let left = (deadline - Utc::now()).to_std().unwrap_or_default() + Duration::from_millis(1);
        let slots = self.slots_of(&call.domain().to_ascii_lowercase());
        tokio::time::timeout(left, slots.acquire_owned())
            .await
            .ok()?
            .ok()
    }

    fn slots_of(&self, domain: &str) -> Arc<Semaphore> {
        // The map holds no invariant a panicking holder could break.
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if slots.len() >= 4096 {
            let per_domain = self.per_domain;
            slots.retain(|_, s| s.available_permits() < per_domain);
        }
        (slots.entry(domain.to_owned()))
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_domain)))
            .clone()
    }

    pub async fn deliver(&self, req: &Request, call: &MailCall) -> PushResult {
        let started = Instant::now();
        let Some(relay) = &self.relay else {
            let ended = Ended::Transient {
                retry_after: None,
                maybe_delivered: false,
            };
            return PushResult {
                error: Some("no SMTP relay on this pusher (set TIDINGS_SMTP_HOST)".into()),
                ..result(req, ended, started)
            };
        };
        if let Err(late) = fresh(req, Utc::now(), started) {
            return *late;
        }
        let submitted = tokio::time::timeout(
            self.timeout,
            relay.submit(&call.from, &call.to, call.message.as_bytes()),
        )
        .await;
        match submitted {
            Ok(Ok(answer)) => PushResult {
                error: answer.error(),
                ..result(req, answer.ended(), started)
            },
            Ok(Err(e)) => refused(
                req,
                FailReason::EndpointRefused,
                tidings_runtime::telemetry::with_causes(&e),
                started,
            ),
            Err(_) => {
                let ended = Ended::Transient {
                    retry_after: None,
                    maybe_delivered: true,
                };
                PushResult {
                    error: Some(format!(
                        "the relay did not finish within {:?}; it may have the mail",
                        self.timeout
                    )),
                    ..result(req, ended, started)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(to: &str) -> MailCall {
        MailCall {
            from: "alerts@tidings.test".into(),
            to: to.into(),
            message: String::new(),
        }
    }

    /// A domain's slots are its own: while one domain's are all taken, another's mail goes, and
    /// a mail waiting for a slot waits no longer than its deadline.
    #[tokio::test]
    async fn each_domain_has_its_own_slots_and_a_wait_ends_at_the_deadline() {
        let mails = Mails {
            relay: None,
            per_domain: 1,
            timeout: Duration::from_secs(1),
            slots: Mutex::new(HashMap::new()),
        };
        let soon = || Utc::now() + chrono::Duration::milliseconds(200);
        let held = mails.domain_slot(&call("a@slow.test"), soon()).await;
        assert!(held.is_some());
        let started = Instant::now();
        // The same domain, written otherwise: the same slots.
        assert!(
            mails
                .domain_slot(&call("b@SLOW.test"), soon())
                .await
                .is_none()
        );
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(150) && waited < Duration::from_secs(1),
            "{waited:?}"
        );
        assert!(
            mails
                .domain_slot(&call("c@fast.test"), soon())
                .await
                .is_some()
        );
        drop(held);
        assert!(
            mails
                .domain_slot(&call("a@slow.test"), soon())
                .await
                .is_some()
        );
    }
}
