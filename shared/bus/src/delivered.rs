//! The delivery log: which outbox rows a push service has accepted, and by which attempt.
//!
//! The pusher records a delivery right after the push service answers 2xx, before it publishes
//! the `delivered` result. Two readers use it:
//!
//! - the pusher, before it POSTs a redelivered request or a later attempt of a row: a row that
//!   was delivered already is not sent again (its `delivered` is reported instead);
//! - the dispatcher's lease sweeper, before it gives up on a `sending` row: a row delivered by
//!   the attempt in flight ends `sent` even though its result never arrived (a dispatcher died
//!   holding it, Postgres was down, or JetStream lost it).
//!
//! It is a JetStream key-value bucket, keyed by outbox id, kept on disk with the streams'
//! replicas and a TTL. Losing it cannot lose a notification, only widen the duplicate window,
//! and it repairs itself: the dispatcher, which alone may make the bucket, makes it again within a
//! sweep interval when it is gone, and an operation that fails opens it anew and is tried once
//! more. Failures that remain are counted in
//! `tidings_delivery_log_errors_total`: while that counter moves, the guard against a second
//! push is off.

use crate::streams::StreamSettings;
use async_nats::jetstream::{self, kv};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, RwLock};
use tidings_domain::OutboxId;
use tidings_domain::subjects::Subjects;

/// The bucket's name under the prefix.
pub const BUCKET: &str = "delivered";

/// What the log holds for a delivered row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The attempt the push service accepted.
    pub attempt: u32,
    /// The push service's message id (`Location`), when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("delivery log {bucket}: {operation}: {source}")]
pub struct DeliveryLogError {
    pub bucket: String,
    pub operation: &'static str,
    #[source]
    pub source: crate::Cause,
}

pub struct DeliveryLog {
    js: jetstream::Context,
    config: kv::Config,
    /// Behind an `Arc`: a `kv::Store` carries the stream's info, and cloning that for every
    /// push would cost more than the lookup it serves.
    store: RwLock<Option<Arc<kv::Store>>>,
    creates: bool,
}

impl DeliveryLog {
    /// The log for `subjects`' prefix. The bucket is created on first use, so this never fails
    /// and a service can start while NATS is still coming up.
    pub fn new(js: jetstream::Context, subjects: &Subjects, streams: &StreamSettings) -> Self {
        tidings_runtime::metrics::at_zero(
            &crate::metrics::metrics().delivery_log_errors,
            ["record", "lookup"].map(|operation| tidings_runtime::metrics::OperationLabels {
                operation: operation.to_owned(),
            }),
        );
        DeliveryLog {
            js,
            config: kv::Config {
                bucket: subjects.bucket(BUCKET),
                history: 1,
                max_age: streams.delivery_log_ttl,
                storage: jetstream::stream::StorageType::File,
                num_replicas: streams.replicas,
                ..Default::default()
            },
            store: RwLock::new(None),
            creates: false,
        }
    }

    /// This log may create its bucket, or set it up again: the dispatcher's, which makes every
    /// stream. Without it the log only opens the bucket the dispatcher made.
    pub fn creating(mut self) -> Self {
        self.creates = true;
        self
    }

    /// Opens the bucket and keeps the handle; an error while the dispatcher has not made it yet.
    pub async fn open(&self) -> Result<Arc<kv::Store>, DeliveryLogError> {
        let store = Arc::new(
            self.js
                .get_key_value(&self.config.bucket)
                .await
                .map_err(|e| self.error("open bucket", e))?,
        );
        if let Ok(mut slot) = self.store.write() {
            *slot = Some(store.clone());
        }
        Ok(store)
    }

    /// Makes the bucket again if it is gone (only a [`DeliveryLog::creating`] log may); whether
    /// it was gone.
    pub async fn restore_if_lost(&self) -> Result<bool, DeliveryLogError> {
        if !self.creates {
            return Ok(false);
        }
        let stream = format!("KV_{}", self.config.bucket);
        match self.js.get_stream(&stream).await {
            Ok(_) => Ok(false),
            Err(e)
                if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
                    if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
            {
                tracing::warn!(bucket = self.bucket(), error = %e, "making the lost delivery log again");
                self.ensure().await.map(|_| true)
            }
            Err(e) => Err(self.error("look for the bucket", e)),
        }
    }

    /// The bucket again, after an operation on it failed: made anew if this log may
    /// ([`DeliveryLog::creating`]), else opened anew.
    async fn reopen(&self) -> Result<Arc<kv::Store>, DeliveryLogError> {
        if self.creates {
            self.ensure().await
        } else {
            self.open().await
        }
    }

    pub fn bucket(&self) -> &str {
        &self.config.bucket
    }

    fn error(&self, operation: &'static str, source: impl Into<crate::Cause>) -> DeliveryLogError {
        DeliveryLogError {
            bucket: self.config.bucket.clone(),
            operation,
            source: source.into(),
        }
    }

    /// Creates the bucket (or updates its settings) and keeps the handle.
    pub async fn ensure(&self) -> Result<Arc<kv::Store>, DeliveryLogError> {
        let store = match self
            .js
            .create_or_update_key_value(self.config.clone())
            .await
        {
            Ok(store) => store,
            Err(e) => {
                // Tidings before 0007 kept the bucket in memory, and JetStream cannot change a
                // stream's storage: such a bucket is replaced (it only holds a short-lived guard).
                if !self.replace_if_in_memory().await {
                    return Err(self.error("create bucket", e));
                }
                self.js
                    .create_or_update_key_value(self.config.clone())
                    .await
                    .map_err(|e| self.error("create bucket", e))?
            }
        };
        let store = Arc::new(store);
        if let Ok(mut slot) = self.store.write() {
            *slot = Some(store.clone());
        }
        Ok(store)
    }

    /// Deletes the bucket if it exists in memory storage; whether it did.
    async fn replace_if_in_memory(&self) -> bool {
        let stream = format!("KV_{}", self.config.bucket);
        let Ok(mut existing) = self.js.get_stream(&stream).await else {
            return false;
        };
        let in_memory = existing
            .info()
            .await
            .is_ok_and(|i| i.config.storage == jetstream::stream::StorageType::Memory);
        if in_memory {
            tracing::warn!(
                bucket = self.bucket(),
                "replacing the in-memory delivery log of an older Tidings with one on disk"
            );
            return self.js.delete_key_value(&self.config.bucket).await.is_ok();
        }
        false
    }

    async fn store(&self) -> Result<Arc<kv::Store>, DeliveryLogError> {
        let held = self.store.read().ok().and_then(|s| s.clone());
        match held {
            Some(store) => Ok(store),
            None => self.reopen().await,
        }
    }

    /// Records that `outbox_id` was delivered by `delivery.attempt`.
    pub async fn record(
        &self,
        outbox_id: OutboxId,
        delivery: &Delivery,
    ) -> Result<(), DeliveryLogError> {
        let key = outbox_id.to_string();
        let value = serde_json::to_vec(delivery).unwrap_or_default();
        let result = async {
            match self.store().await?.put(&key, value.clone().into()).await {
                Ok(_) => Ok(()),
                Err(e) => {
                    tracing::warn!(bucket = self.bucket(), outbox_id = %outbox_id, error = %e, "recording a delivery failed; opening the bucket again and trying again");
                    self.reopen()
                        .await?
                        .put(&key, value.into())
                        .await
                        .map(|_| ())
                        .map_err(|e| self.error("record", e))
                }
            }
        }
        .await;
        self.count(&result, "record", outbox_id);
        result
    }

    /// The delivery recorded for `outbox_id`, if any.
    pub async fn lookup(&self, outbox_id: OutboxId) -> Result<Option<Delivery>, DeliveryLogError> {
        let key = outbox_id.to_string();
        let result = async {
            match self.store().await?.get(&key).await {
                Ok(v) => Ok(v),
                Err(e) => {
                    tracing::warn!(bucket = self.bucket(), outbox_id = %outbox_id, error = %e, "looking up a delivery failed; opening the bucket again and trying again");
                    self.reopen()
                        .await?
                        .get(&key)
                        .await
                        .map_err(|e| self.error("lookup", e))
                }
            }
        }
        .await;
        self.count(&result, "lookup", outbox_id);
        // A value this build cannot read counts as no record: the caller then acts as it would
        // without the log (at worst a duplicate push), which is all the log narrows.
        Ok(result?.and_then(|bytes| serde_json::from_slice(&bytes).ok()))
    }

    fn count<T>(&self, result: &Result<T, DeliveryLogError>, operation: &str, outbox_id: OutboxId) {
        if let Err(e) = result {
            tracing::error!(outbox_id = %outbox_id, error = %e, "delivery log unavailable: the guard against a second push is off for this row");
            crate::metrics::metrics()
                .delivery_log_errors
                .get_or_create(&tidings_runtime::metrics::OperationLabels {
                    operation: operation.to_owned(),
                })
                .inc();
        }
    }
}
