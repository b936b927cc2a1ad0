//! Dispatcher configuration: every setting a flag and an environment variable.

use std::sync::Arc;
use std::time::Duration;
use tidings_bus::NatsArgs;
use tidings_bus::streams::StreamSettings;
use tidings_domain::backoff::RetryPolicy;
use tidings_domain::duration::parse_duration;
use tidings_domain::receiver::{Breaker, Pacing};
use tidings_domain::retention::{Retention, parse_retention};
use tidings_domain::subjects::{InvalidPrefix, Subjects};
use tidings_domain::validity::Validity;
use tidings_runtime::flags;
use tidings_runtime::ops::OpsArgs;
use tidings_sealing::SecretKeys;
use tidings_source::SourceArgs;
use tidings_source::SourceConfig;

/// Default slack between the last moment a pusher may still be sending (deadline + its HTTP
/// timeout) and the moment the sweeper may take the row back.
pub const LEASE_MARGIN: Duration = Duration::from_secs(5);

/// How long a reading of the push stream stands in for another while it leaves room for a whole
/// claim (`Dispatcher::room`). Asking costs nats-server ~170 µs a time (the stream's whole info),
/// every dispatch cycle (18 a second at 2,000 notifications/s); other dispatchers' publishes go
/// unseen this long at most.
pub const PUSH_READING_FRESH: Duration = Duration::from_millis(250);

#[derive(clap::Parser, Clone, Debug)]
#[command(name = "tidings-dispatcher", version, about)]
pub struct Config {
    #[command(flatten)]
    pub database: tidings_runtime::secrets::DatabaseArgs,
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub ops: OpsArgs,
    #[command(flatten)]
    pub webhook_keys: tidings_sealing::SecretKeyArgs,
    #[command(flatten)]
    pub email: tidings_email::settings::SenderArgs,
    /// How long the rows of an email address not yet confirmed wait between looks: its owner
    /// may open the link any moment, and the rows are few (one device's watches).
    #[arg(long, env = "TIDINGS_EMAIL_UNCONFIRMED_WAIT", default_value = "30s", value_parser = parse_duration)]
    pub email_unconfirmed_wait: Duration,
    /// Link a notification opens, a template with {item}.
    #[arg(long, env = "TIDINGS_ITEM_PAGE_URL")]
    pub item_page_url: Option<String>,

    /// Requests per ingest statement (one INSERT); ingest takes a twentieth as many messages per
    /// call, as detectors send up to 50 requests a message.
    #[arg(long, env = "TIDINGS_INGEST_BATCH", default_value_t = 1000)]
    pub ingest_batch: usize,
    /// Ingest and result batches in flight at once.
    #[arg(long, env = "TIDINGS_CONSUMER_CONCURRENCY", default_value_t = 4)]
    pub consumer_concurrency: usize,
    /// Rows per claim.
    #[arg(long, env = "TIDINGS_CLAIM_BATCH", default_value_t = 500)]
    pub claim_batch: i64,
    /// How long a claimed pending/retry row is hidden from other dispatchers.
    #[arg(long, env = "TIDINGS_CLAIM_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub claim_lease: Duration,
    /// Concurrent claim-and-dispatch loops in this process.
    #[arg(long, env = "TIDINGS_DISPATCH_WORKERS", default_value_t = 2)]
    pub dispatch_workers: usize,
    /// How often an idle dispatcher looks for due rows. New rows wake it (its ingest rings), so
    /// the poll only times rows due by the clock (retries, releases) and rows written elsewhere
    /// (replays); 50 ms took a fifth to a quarter of the CPU per `sent` at 100/s.
    #[arg(long, env = "TIDINGS_POLL_INTERVAL", default_value = "250ms", value_parser = parse_duration)]
    pub poll_interval: Duration,

    /// Retries before a transient failure is final.
    #[arg(long, env = "TIDINGS_MAX_RETRIES", default_value_t = 8)]
    pub max_retries: u32,
    /// First retry delay; each further retry doubles it (up to 30 min).
    #[arg(long, env = "TIDINGS_RETRY_BASE", default_value = "30s", value_parser = parse_duration)]
    pub retry_base: Duration,
    /// The freshness bound: a push is POSTed at most this long after the re-check whose value it
    /// carries; a pusher refuses (reports `expired`) a request past it, and the row goes back for
    /// a new re-check.
    #[arg(long, env = "TIDINGS_PUSH_DEADLINE", default_value = "5s", value_parser = parse_duration)]
    pub push_deadline: Duration,
    /// The pusher's HTTP timeout (set the pusher to the same value).
    #[arg(long, env = "TIDINGS_PUSH_HTTP_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub push_http_timeout: Duration,
    /// How long a result may stay unacknowledged by a dispatcher (one that died holding it)
    /// before JetStream hands it to another.
    #[arg(long, env = "TIDINGS_RESULT_ACK_WAIT", default_value = "10s", value_parser = parse_duration)]
    pub result_ack_wait: Duration,
    /// How long a `sending` row waits for its result before the sweeper looks for it in the
    /// delivery log and otherwise retries it. Must exceed push deadline + push HTTP timeout +
    /// result ack wait + 5 s.
    #[arg(long, env = "TIDINGS_SENDING_LEASE", default_value = "60s", value_parser = parse_duration)]
    pub sending_lease: Duration,
    #[arg(long, env = "TIDINGS_SWEEP_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub sweep_interval: Duration,
    /// Ingest stops taking new notifications while dispatch's oldest claimed row has been due
    /// longer than this, and takes them again once it is below half (0s: never): offered more
    /// than it can send, a dispatcher sends as much as it can, and the surplus waits in the
    /// enqueue stream rather than taking the cores from dispatch and push.
    #[arg(long, env = "TIDINGS_INGEST_ADMISSION_LAG", default_value = "1s", value_parser = parse_duration)]
    pub admission_lag: Duration,
    /// Dispatch pauses while the push stream holds this many PushRequests (0: no limit), so a
    /// slow pusher leaves the backlog in the outbox, where rows are re-checked before sending.
    #[arg(long, env = "TIDINGS_PUSH_BACKLOG_LIMIT", default_value_t = 2000)]
    pub push_backlog_limit: u64,
    /// PushRequests per push-stream message, 1 to 100. Above 1, the requests a dispatch batch
    /// publishes go in `PushRequests` messages of up to this many, so JetStream's cost per
    /// message is paid once per batch; 1 (one message per request) is what pushers older than
    /// batches can read: set it while such pushers run (docs/operations.md, "Upgrading").
    /// TIDINGS_PUSH_BACKLOG_LIMIT counts each waiting message as this many requests.
    #[arg(long, env = "TIDINGS_DISPATCH_PUSH_BATCH", default_value_t = 50)]
    pub push_batch: usize,
    /// Postgres connections of each replica; at least what its loops hold at once
    /// (dispatch workers + 2 × consumer concurrency + 2: 12 with the defaults).
    #[arg(long, env = "TIDINGS_DISPATCHER_DB_POOL", default_value_t = 12)]
    pub db_pool: u32,
    /// Web Push TTL: the longest a push service keeps a message for an offline device. A
    /// notification's own TTL is what is left of its validity, at most this.
    #[arg(long, env = "TIDINGS_PUSH_TTL", default_value = "1h", value_parser = parse_duration)]
    pub push_ttl: Duration,
    /// How long a price notification (`price_below`, `price_drop`) may be shown as current
    /// after its re-check: its push TTL at most, and the window in which a broken condition
    /// corrects it.
    #[arg(long, env = "TIDINGS_VALIDITY_PRICE", default_value = "20m", value_parser = parse_duration)]
    pub validity_price: Duration,
    /// The same for a `back_in_stock` notification (stock changes less often than prices).
    #[arg(long, env = "TIDINGS_VALIDITY_STOCK", default_value = "1h", value_parser = parse_duration)]
    pub validity_stock: Duration,
    /// How long outbox rows are kept, in whole days (at least 8d): a week whose every day is
    /// older is dropped once all its rows are decided, so rows stay between this and 7 days more.
    #[arg(long, env = "TIDINGS_RETENTION", default_value = "30d", value_parser = parse_retention)]
    pub retention: Retention,
    /// How long the operators' audit trail keeps an action, in whole days (at least 8d).
    #[arg(long, env = "TIDINGS_AUDIT_RETENTION", default_value = "365d", value_parser = parse_retention)]
    pub audit_retention: Retention,
    /// Failing result batches in a row after which a webhook endpoint's circuit opens and its
    /// rows are held back (0: never).
    #[arg(long, env = "TIDINGS_WEBHOOK_BREAKER_FAILURES", default_value_t = 5)]
    pub webhook_breaker_failures: u32,
    /// How long those failures must have lasted, too: a burst is not a broken receiver.
    #[arg(long, env = "TIDINGS_WEBHOOK_BREAKER_AFTER", default_value = "10s", value_parser = parse_duration)]
    pub webhook_breaker_after: Duration,
    /// How long they are held back at first; doubled per failed probe, up to an hour.
    #[arg(long, env = "TIDINGS_WEBHOOK_BREAKER_PAUSE", default_value = "30s", value_parser = parse_duration)]
    pub webhook_breaker_pause: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Secret(#[from] tidings_runtime::secrets::SecretError),
    #[error(transparent)]
    WebhookKeys(#[from] tidings_sealing::KeysError),
    #[error("email")]
    Email(#[from] tidings_email::settings::SettingsError),
    #[error(transparent)]
    Source(#[from] tidings_source::SourceConfigError),
    #[error(
        "TIDINGS_RETRY_BASE ({0:?}) must be at least 100ms: retries would hammer the source and push services"
    )]
    RetryBase(Duration),
    #[error(
        "TIDINGS_SENDING_LEASE ({lease:?}) must exceed TIDINGS_PUSH_DEADLINE ({deadline:?}) + \
         TIDINGS_PUSH_HTTP_TIMEOUT ({http:?}) + TIDINGS_RESULT_ACK_WAIT ({ack_wait:?}) + a margin \
         of {margin:?}: otherwise the sweeper could give up on a row whose push is still in \
         flight, or whose result a dying dispatcher held"
    )]
    LeaseTooShort {
        lease: Duration,
        deadline: Duration,
        http: Duration,
        ack_wait: Duration,
        margin: Duration,
    },
    #[error(
        "TIDINGS_DELIVERY_LOG_TTL ({ttl:?}) must exceed TIDINGS_SENDING_LEASE ({lease:?}): the \
         sweeper reads the log when a lease runs out"
    )]
    DeliveryLogTooShort { ttl: Duration, lease: Duration },
    #[error(
        "TIDINGS_CLAIM_LEASE ({claim:?}) must be at least TIDINGS_SOURCE_TIMEOUT ({source_timeout:?})"
    )]
    ClaimLeaseTooShort {
        claim: Duration,
        source_timeout: Duration,
    },
    #[error("{name} must be at least 1")]
    Zero { name: &'static str },
    #[error(
        "{name} ({value:?}) must be at least 1s: a notification with no validity left is never sent"
    )]
    ValidityTooShort { name: &'static str, value: Duration },
    #[error(
        "TIDINGS_DISPATCH_PUSH_BATCH ({0}) must be 1 to {max}: a push-stream message carries at \
         most that many requests",
        max = tidings_domain::messages::MAX_REQUESTS_PER_MESSAGE
    )]
    PushBatch(usize),
    #[error(
        "TIDINGS_DISPATCHER_DB_POOL ({pool}) is below the {need} connections the loops hold at \
         once (TIDINGS_DISPATCH_WORKERS + 2 × TIDINGS_CONSUMER_CONCURRENCY + 2): they would wait \
         on each other for connections"
    )]
    DbPool { pool: u32, need: u32 },
    #[error(transparent)]
    Prefix(#[from] InvalidPrefix),
}

/// Validated settings the loops run on; tests build these directly.
#[derive(Clone, Debug)]
pub struct Settings {
    pub subjects: Subjects,
    pub streams: StreamSettings,
    pub source: SourceConfig,
    pub item_page_url: Option<String>,
    pub ingest_batch: usize,
    pub consumer_concurrency: usize,
    pub claim_batch: i64,
    pub claim_lease: Duration,
    pub dispatch_workers: usize,
    pub poll_interval: Duration,
    pub retry: RetryPolicy,
    pub push_deadline: Duration,
    pub push_http_timeout: Duration,
    pub result_ack_wait: Duration,
    pub sending_lease: Duration,
    pub lease_margin: Duration,
    pub sweep_interval: Duration,
    pub push_ttl: Duration,
    pub validity: Validity,
    pub push_backlog_limit: u64,
    /// How long a reading of the push stream stands in for the next ([`PUSH_READING_FRESH`]).
    pub push_reading_fresh: Duration,
    pub push_batch: usize,
    pub admission_lag: Duration,
    pub db_pool: u32,
    pub retention: Retention,
    pub audit_retention: Retention,
    pub webhook_breaker: Breaker,
    pub webhook_pacing: Pacing,
    /// Keys that open webhook secrets stored sealed (the api's keys).
    pub webhook_secret_keys: Option<Arc<SecretKeys>>,
    /// Who mails; `None`: email is off, and an email row waits (retried) until it is on.
    pub email: Option<Arc<tidings_email::settings::Sender>>,
    /// How long an unconfirmed address's rows wait before they are looked at again.
    pub unconfirmed_wait: Duration,
}

impl Settings {
    /// Every setting at its flag's default but where things are: for tests and benchmarks.
    pub fn new(subjects: Subjects, source: SourceConfig) -> Self {
        let placeholders = ["--database-url", "-", "--source-url", "-"];
        flags::parsed_defaults::<Config>(&placeholders).settings_with(subjects, source)
    }

    /// The shortest lease that is safe: the last moment a push can still start (its deadline),
    /// its HTTP exchange, and the result's redelivery if a dispatcher dies holding it, plus a
    /// margin. A result produced within that time decides the row, not the sweeper.
    pub fn min_sending_lease(&self) -> Duration {
        self.push_deadline + self.push_http_timeout + self.result_ack_wait + self.lease_margin
    }

    /// Connections the loops hold at once: one per dispatch worker, one per ingest and per
    /// results batch in flight, the sweeper's, and one for the idle pick-up.
    pub fn db_connections_needed(&self) -> u32 {
        let need = self.dispatch_workers + 2 * self.consumer_concurrency + 2;
        // A need past `u32` connections is one no pool meets: the check then refuses it.
        u32::try_from(need).unwrap_or(u32::MAX)
    }

    /// The rules a configuration must satisfy before the dispatcher starts.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.retry.base < Duration::from_millis(100) {
            return Err(ConfigError::RetryBase(self.retry.base));
        }
        if self.sending_lease <= self.min_sending_lease() {
            return Err(ConfigError::LeaseTooShort {
                lease: self.sending_lease,
                deadline: self.push_deadline,
                http: self.push_http_timeout,
                ack_wait: self.result_ack_wait,
                margin: self.lease_margin,
            });
        }
        if self.streams.delivery_log_ttl <= self.sending_lease {
            return Err(ConfigError::DeliveryLogTooShort {
                ttl: self.streams.delivery_log_ttl,
                lease: self.sending_lease,
            });
        }
        if self.claim_lease < self.source.max_timeout() {
            return Err(ConfigError::ClaimLeaseTooShort {
                claim: self.claim_lease,
                source_timeout: self.source.max_timeout(),
            });
        }
        for (name, v) in [
            ("TIDINGS_INGEST_BATCH", self.ingest_batch),
            ("TIDINGS_CONSUMER_CONCURRENCY", self.consumer_concurrency),
            ("TIDINGS_DISPATCH_WORKERS", self.dispatch_workers),
            (
                "TIDINGS_CLAIM_BATCH",
                // A negative batch reads as 0, which the check below refuses.
                usize::try_from(self.claim_batch).unwrap_or(0),
            ),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero { name });
            }
        }
        for (name, value) in [
            ("TIDINGS_VALIDITY_PRICE", self.validity.price),
            ("TIDINGS_VALIDITY_STOCK", self.validity.stock),
        ] {
            if value < Duration::from_secs(1) {
                return Err(ConfigError::ValidityTooShort { name, value });
            }
        }
        if !(1..=tidings_domain::messages::MAX_REQUESTS_PER_MESSAGE).contains(&self.push_batch) {
            return Err(ConfigError::PushBatch(self.push_batch));
        }
        if self.db_pool < self.db_connections_needed() {
            return Err(ConfigError::DbPool {
                pool: self.db_pool,
                need: self.db_connections_needed(),
            });
        }
        Ok(())
    }
}

impl Config {
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let mut s = self.settings_with(self.nats.subjects()?, self.source.config()?);
        s.webhook_secret_keys = self.webhook_keys.keys()?;
        s.email = self.email.sender()?.map(Arc::new);
        s.validate()?;
        Ok(s)
    }

    fn settings_with(&self, subjects: Subjects, source: SourceConfig) -> Settings {
        Settings {
            subjects,
            streams: self.nats.streams(),
            source,
            item_page_url: self.item_page_url.clone(),
            ingest_batch: self.ingest_batch,
            consumer_concurrency: self.consumer_concurrency,
            claim_batch: self.claim_batch,
            claim_lease: self.claim_lease,
            dispatch_workers: self.dispatch_workers,
            poll_interval: self.poll_interval,
            retry: RetryPolicy::new(self.retry_base, self.max_retries),
            push_deadline: self.push_deadline,
            push_http_timeout: self.push_http_timeout,
            result_ack_wait: self.result_ack_wait,
            sending_lease: self.sending_lease,
            lease_margin: LEASE_MARGIN,
            sweep_interval: self.sweep_interval,
            push_ttl: self.push_ttl,
            validity: Validity {
                price: self.validity_price,
                stock: self.validity_stock,
            },
            push_backlog_limit: self.push_backlog_limit,
            push_reading_fresh: PUSH_READING_FRESH,
            push_batch: self.push_batch,
            admission_lag: self.admission_lag,
            db_pool: self.db_pool,
            retention: self.retention,
            audit_retention: self.audit_retention,
            webhook_breaker: Breaker {
                failures: self.webhook_breaker_failures,
                after: self.webhook_breaker_after,
                pause: self.webhook_breaker_pause,
                max_pause: Duration::from_secs(3600).max(self.webhook_breaker_pause),
            },
            webhook_pacing: Pacing::default(),
            webhook_secret_keys: None,
            email: None,
            unconfirmed_wait: self.email_unconfirmed_wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings::new(
            Subjects::new("t").unwrap(),
            SourceConfig::new("http://catalog/{item}"),
        )
    }

    #[test]
    fn defaults_are_valid() {
        settings().validate().unwrap();
    }

    #[test]
    fn a_lease_that_a_push_could_outlive_refuses_to_start() {
        let mut s = settings();
        s.sending_lease = s.min_sending_lease();
        assert!(matches!(
            s.validate(),
            Err(ConfigError::LeaseTooShort { .. })
        ));
        s.sending_lease += Duration::from_millis(1);
        s.validate().unwrap();
    }

    #[test]
    fn a_result_ack_wait_the_lease_cannot_cover_refuses_to_start() {
        let mut s = settings();
        s.result_ack_wait = s.sending_lease;
        assert!(matches!(
            s.validate(),
            Err(ConfigError::LeaseTooShort { .. })
        ));
        let mut s = settings();
        s.streams.delivery_log_ttl = s.sending_lease;
        assert!(matches!(
            s.validate(),
            Err(ConfigError::DeliveryLogTooShort { .. })
        ));
    }

    #[test]
    fn a_pool_smaller_than_what_the_loops_hold_refuses_to_start() {
        let mut s = settings();
        assert_eq!(
            s.db_connections_needed(),
            s.db_pool,
            "the default is what the loops hold"
        );
        s.consumer_concurrency += 1;
        assert!(matches!(
            s.validate(),
            Err(ConfigError::DbPool { pool: 12, need: 14 })
        ));
        s.db_pool = 14;
        s.validate().unwrap();
    }

    #[test]
    fn zero_batches_are_refused() {
        let mut s = settings();
        s.claim_batch = 0;
        assert!(matches!(s.validate(), Err(ConfigError::Zero { .. })));
    }

    #[test]
    fn a_validity_under_a_second_is_refused() {
        let mut s = settings();
        assert_eq!(
            s.validity,
            Validity::default(),
            "the flags' defaults are the domain's"
        );
        s.validity.stock = Duration::from_millis(500);
        assert!(matches!(
            s.validate(),
            Err(ConfigError::ValidityTooShort {
                name: "TIDINGS_VALIDITY_STOCK",
                ..
            })
        ));
    }

    #[test]
    fn a_push_batch_outside_what_a_message_may_carry_is_refused() {
        let mut s = settings();
        assert_eq!(s.push_batch, 50, "batches unless configured");
        for bad in [0, tidings_domain::messages::MAX_REQUESTS_PER_MESSAGE + 1] {
            s.push_batch = bad;
            assert!(matches!(s.validate(), Err(ConfigError::PushBatch(n)) if n == bad));
        }
        s.push_batch = tidings_domain::messages::MAX_REQUESTS_PER_MESSAGE;
        s.validate().unwrap();
    }
}
