//! The dispatcher's metric families: the outbox backlog, ingest, and detection to delivery.

use tidings_runtime::metrics::{
    Counter, Family, Gauge, HeldLabels, Histogram, KeyLabels, ReleaseLabels, ResultLabels,
    StateLabels, StatusLabels, Traced, exponential_buckets,
};

tidings_runtime::families! {
    pub struct DispatcherMetrics {
        outbox_rows: Family<StatusLabels, Gauge> = Family::default()
            => "tidings_outbox_rows",
            "Non-terminal outbox rows by state (pending, retry, sending), read every 10 s, or up \
             to a minute apart while a reading takes over 1 % of that (a very large backlog)";
        outbox_held: Family<HeldLabels, Gauge> = Family::default()
            => "tidings_outbox_held",
            "Pending rows waiting for their reader's release, by why (quiet_hours, cap, digest)";
        held: Family<HeldLabels, Counter> = Family::default()
            => "tidings_notifications_held",
            "Notifications the re-check found true that were made to wait for their reader, \
             by why (quiet_hours, cap, digest); one that waits again at its release counts again";
        released: Family<ReleaseLabels, Counter> = Family::default()
            => "tidings_notifications_released",
            "Held notifications at their release, by why they were held and what became of \
             them (sent: re-checked and sent; dropped: no longer true, or expired; held: they \
             wait again)";
        digest_members: Histogram = Histogram::new(exponential_buckets(1.0, 2.0, 8))
            => "tidings_digest_members",
            "Notifications each digest sent carries (those that held at the digest time)";
        oldest_due_seconds: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default()
            => "tidings_outbox_oldest_due_seconds", "Age of the oldest due outbox row";
        /// How long the oldest `sending` row has been past its lease (0: none is).
        lease_overdue_seconds: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default()
            => "tidings_outbox_lease_overdue_seconds",
            "How long the oldest sending row has been past its lease (0: none is); the lease \
             sweeper takes such rows back, so this stays near 0 while it works";
        /// Outbox weeks past the retention kept because a row in them is still to be decided.
        expired_partitions_kept: Gauge = Gauge::default()
            => "tidings_outbox_expired_partitions_kept",
            "Outbox weeks wholly older than TIDINGS_RETENTION that are kept because a row in \
             them is still pending, retrying or sending (0 normally)";
        ingested: Family<ResultLabels, Counter> = Family::default()
            => "tidings_ingested",
            "EnqueueRequests ingested by result (new; duplicate: absorbed by the dedup key)";
        /// 1 while ingest takes new notifications, 0 while dispatch is behind and it holds them.
        ingest_admitted: Gauge = Gauge::default()
            => "tidings_ingest_admitted",
            "1 while ingest takes new notifications; 0 while dispatch is behind (its oldest \
             claimed row was due longer than TIDINGS_INGEST_ADMISSION_LAG) and they wait in the \
             enqueue stream";
        webhook_endpoints: Family<StateLabels, Gauge> = Family::default()
            => "tidings_webhook_endpoints",
            "Active webhook endpoints whose breaker is open or half_open, or that are paced";
        webhook_failing_seconds: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default()
            => "tidings_webhook_failing_seconds",
            "The longest an active webhook endpoint has failed every delivery, once its failures \
             reached the breaker's threshold (0: none has)";
        webhook_breaker_open_seconds: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default()
            => "tidings_webhook_breaker_open_seconds",
            "The longest an active webhook endpoint's breaker has stayed open or half-open, from \
             its first failure (0: none is)";
        /// Webhooks held because their signing secret did not open, by the key it needs.
        secrets_unopened: Family<KeyLabels, Counter> = Family::default()
            => "tidings_webhook_secrets_unopened",
            "Webhooks held (not sent unsigned) because their endpoint's signing secret did not \
             open, by the sealing key it needs (or none, unsealed, corrupt, malformed, missing)";
        // 10 ms … ~2.9 h: a notification retried on the longest schedule (8 retries from 30 s,
        // capped at 30 min, ~1.5 h) still lands in a bucket, so p99 does not clip.
        detection_to_delivery: Traced = Traced::new(exponential_buckets(0.01, 2.0, 21))
            => "tidings_detection_to_delivery_seconds",
            "Time from detection to the push service accepting the notification";
    }
}

/// Held webhooks' counter starts at 0 for the reasons known before any key id, so the first one
/// after a start shows in `increase()`.
pub fn init_webhook_labels() {
    for key in ["none", "unsealed", "corrupt", "malformed", "missing"] {
        let _ = metrics().secrets_unopened.get_or_create(&KeyLabels {
            key: key.to_owned(),
        });
    }
}
