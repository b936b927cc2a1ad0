//! The command line: one tree of subcommands, every option also an environment variable where
//! a script would set it once.

use clap::{Args, Parser, Subcommand};

const EXIT_CODES: &str = "\
Exit codes:
  0  done; doctor found nothing wrong
  1  doctor found something wrong (bulk operations report what they left alone, and exit 0)
  2  bad command line or request (also clap's own usage errors)
  3  not found
  4  refused by the resource's state (not replayable, not cancellable, …)
  5  no operator token, or a wrong one
  6  the operator api, or what it needs (Postgres, NATS), could not be reached or failed";

/// Operate a Tidings deployment through its operator api: outbox rows and their delivery
/// attempts, bulk replay and cancel, dead letters, devices and watches, and `doctor`.
#[derive(Debug, Parser)]
#[command(name = "tidings", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// The api's operator port (TIDINGS_OPS_LISTEN), e.g. through `kubectl port-forward`.
    #[arg(
        long,
        global = true,
        env = "TIDINGS_OPS_URL",
        default_value = "http://127.0.0.1:9090"
    )]
    pub api: String,
    /// The operator token (TIDINGS_ADMIN_TOKEN of the api).
    #[arg(
        long,
        global = true,
        env = "TIDINGS_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// A file holding the operator token (a mounted Secret, say).
    #[arg(
        long,
        global = true,
        env = "TIDINGS_ADMIN_TOKEN_FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<std::path::PathBuf>,
    /// Print JSON (the api's answers) instead of tables, for scripts.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Outbox rows: list, show, count, replay, cancel.
    #[command(subcommand)]
    Outbox(Box<Outbox>),
    /// Every delivery attempt of one outbox row.
    Attempts {
        /// The outbox row's id.
        id: String,
    },
    /// Dead-lettered messages: list, show, redrive, purge.
    #[command(subcommand)]
    Dlq(Box<Dlq>),
    /// A device: show, pause (its notifications are withheld), resume.
    #[command(subcommand)]
    Device(Object),
    /// A watch: show, pause, resume.
    #[command(subcommand)]
    Watch(Object),
    /// API clients, who register webhook endpoints: create (prints its key once), ls, revoke.
    #[command(subcommand)]
    Client(Client),
    /// The operators' audit trail, newest first: who did what, when, to how many rows.
    Audit {
        /// Only this operator's actions (the token's name).
        #[arg(long)]
        operator: Option<String>,
        /// Only actions since then (RFC 3339).
        #[arg(long)]
        since: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Your own webhook endpoint, as its API client (the public api, the endpoint's token, not
    /// the operator's): its status, its attempts, and a recovery after an outage on your side.
    Endpoint(EndpointArgs),
    /// Check the deployment end to end and say what is wrong: api, schema, due backlog, the
    /// keys of sealed webhook secrets, streams, consumers and their lag, the VAPID key pair of
    /// the api and every pusher.
    Doctor {
        /// Messages a consumer may have waiting before it counts as lagging.
        #[arg(long, default_value_t = 10_000)]
        max_lag: u64,
        /// Seconds the oldest due row may have waited.
        #[arg(long, default_value_t = 300)]
        max_due_age: u64,
    },
}

/// Which outbox rows: every option narrows the set.
#[derive(Debug, Args, Default, Clone)]
pub struct Filter {
    /// pending, retry, sending, sent, dropped or failed.
    #[arg(long)]
    pub status: Option<String>,
    /// A drop or failure reason, e.g. condition_lost, retries_exhausted, cancelled.
    #[arg(long)]
    pub reason: Option<String>,
    /// web_push or webhook.
    #[arg(long)]
    pub channel: Option<String>,
    /// A device's id.
    #[arg(long)]
    pub device: Option<String>,
    /// A watch's id.
    #[arg(long)]
    pub watch: Option<String>,
    /// The watched item's code.
    #[arg(long)]
    pub item: Option<String>,
    /// Rows with an attempt through this push service host.
    #[arg(long)]
    pub push_host: Option<String>,
    /// Rows whose last push answer had this HTTP status.
    #[arg(long)]
    pub http_status: Option<u16>,
    /// Detected at or after this instant (RFC 3339).
    #[arg(long)]
    pub from: Option<String>,
    /// Detected before this instant (RFC 3339).
    #[arg(long)]
    pub to: Option<String>,
}

impl Filter {
    pub fn is_empty(&self) -> bool {
        self.pairs().is_empty()
    }

    /// The filter as query parameters / JSON fields (the api's names).
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let mut put = |k: &'static str, v: Option<String>| {
            if let Some(v) = v {
                out.push((k, v));
            }
        };
        put("status", self.status.clone());
        put("reason", self.reason.clone());
        put("channel", self.channel.clone());
        put("device_id", self.device.clone());
        put("watch_id", self.watch.clone());
        put("item", self.item.clone());
        put("push_host", self.push_host.clone());
        put("http_status", self.http_status.map(|h| h.to_string()));
        put("from", self.from.clone());
        put("to", self.to.clone());
        out
    }
}

/// How a bulk change runs.
#[derive(Debug, Args, Clone)]
pub struct Bulk {
    /// Count and sample what would change; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Make the change (a bulk change without it only says what it would do).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Every row, when no filter option is given.
    #[arg(long)]
    pub all: bool,
    /// Rows per request.
    #[arg(long, default_value_t = 500)]
    pub batch: u32,
    /// Resume an interrupted operation: the cursor it printed.
    #[arg(long, requires = "up_to")]
    pub cursor: Option<String>,
    /// Resume an interrupted operation: the `up_to` it printed.
    #[arg(long, requires = "cursor")]
    pub up_to: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Outbox {
    /// List rows, newest first.
    Ls {
        #[command(flatten)]
        filter: Filter,
        /// Rows to show (pages through the api 200 at a time).
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// One row with its delivery record and attempts.
    Show { id: String },
    /// Rows by state and reason, and the due backlog.
    Stats,
    /// Replay failed or dropped rows: the ids given, or every row the filter matches. Each row
    /// is replayed once; a replay is never replayed.
    Replay {
        /// Outbox row ids (instead of a filter).
        ids: Vec<String>,
        #[command(flatten)]
        filter: Filter,
        #[command(flatten)]
        bulk: Bulk,
    },
    /// Cancel pending or retrying rows: the ids given, or every row the filter matches.
    Cancel {
        /// Outbox row ids (instead of a filter).
        ids: Vec<String>,
        #[command(flatten)]
        filter: Filter,
        #[command(flatten)]
        bulk: Bulk,
    },
}

/// Which dead letters.
#[derive(Debug, Args, Clone, Default)]
pub struct DlqFilter {
    /// The stream they were consumed from: enqueue, push or result.
    #[arg(long)]
    pub from: Option<String>,
    /// A part of the reason (case-insensitive).
    #[arg(long)]
    pub reason: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Dlq {
    /// List dead letters, oldest first.
    Ls {
        #[command(flatten)]
        filter: DlqFilter,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// One dead letter with its headers (the reason among them) and payload.
    Show { sequence: u64 },
    /// Publish dead letters back to the subject they came from (once their cause is fixed):
    /// the sequences given, or every one the filter matches.
    Redrive {
        /// Dead-letter sequences (instead of, or within, a filter).
        sequences: Vec<u64>,
        #[command(flatten)]
        filter: DlqFilter,
        #[command(flatten)]
        bulk: DlqBulk,
    },
    /// Delete dead letters: the sequences given, or every one the filter matches.
    Purge {
        /// Dead-letter sequences (instead of, or within, a filter).
        sequences: Vec<u64>,
        #[command(flatten)]
        filter: DlqFilter,
        #[command(flatten)]
        bulk: DlqBulk,
    },
}

#[derive(Debug, Args, Clone)]
pub struct DlqBulk {
    /// Count what would be done; do nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do it (without it, only say what would be done).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Every dead letter, when no sequence or filter is given.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Subcommand)]
pub enum Object {
    /// Show it, with its notifications by status.
    Show { id: String },
    /// Pause it: its due notifications are withheld at the re-check until it is resumed.
    Pause { id: String },
    /// Resume it.
    Resume { id: String },
}

#[derive(Debug, Subcommand)]
pub enum Client {
    /// Issue a key to a new client; the key is printed once (Tidings keeps only its hash).
    Create {
        /// Who it is, for operators: 1–100 characters.
        name: String,
    },
    /// Every client, newest first, with its endpoints counted.
    Ls,
    /// Revoke a client's key: it registers no more endpoints; those it made keep receiving
    /// until removed.
    Revoke { id: String },
}

/// `tidings endpoint …`: where the public api is and the endpoint's token.
#[derive(Debug, Args)]
pub struct EndpointArgs {
    /// The api's public address (its TIDINGS_LISTEN), e.g. https://tidings.example.
    #[arg(long, env = "TIDINGS_API_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The endpoint's token (the one its registration answered).
    #[arg(long, env = "TIDINGS_ENDPOINT_TOKEN", hide_env_values = true)]
    pub endpoint_token: String,
    #[command(subcommand)]
    pub command: Endpoint,
}

#[derive(Debug, Subcommand)]
pub enum Endpoint {
    /// Its URL, breaker (closed, open until, half-open) and pace.
    Status,
    /// Its latest attempts, newest first: status, duration, your answer's first bytes.
    Attempts {
        /// Webhooks to list.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Replay its webhooks that ended failed or expired since a time; each is re-checked and
    /// sent only if it still holds.
    Recover {
        /// An RFC 3339 instant, e.g. 2026-12-04T10:00:00Z (at most 30 days ago).
        #[arg(long)]
        since: String,
    },
}
