//! `tidings outbox …` and `tidings attempts`.

use crate::args::{Bulk, Filter, Outbox};
use crate::client::{Api, CliError, exit};
use crate::table::{self, cell};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use tidings_api_types::attempts::{AttemptList, AttemptRecord};
use tidings_api_types::outbox::{
    BulkReport, Cancelled, OutboxList, OutboxRow, OutboxStats, Replayed,
};
use uuid::Uuid;

pub async fn run(api: &Api, json_out: bool, command: Outbox) -> Result<u8, CliError> {
    match command {
        Outbox::Ls { filter, limit } => ls(api, json_out, &filter, limit).await,
        Outbox::Show { id } => show(api, json_out, &id).await,
        Outbox::Stats => stats(api, json_out).await,
        Outbox::Replay { ids, filter, bulk } => {
            change(api, json_out, Change::Replay, ids, filter, bulk).await
        }
        Outbox::Cancel { ids, filter, bulk } => {
            change(api, json_out, Change::Cancel, ids, filter, bulk).await
        }
    }
}

async fn ls(api: &Api, json_out: bool, filter: &Filter, limit: usize) -> Result<u8, CliError> {
    let items = api
        .list::<OutboxList>("/v1/admin/outbox", &filter.pairs(), limit)
        .await?;
    table::listing(
        json_out,
        &items,
        &[
            ("id", "/id"),
            ("channel", "/channel"),
            ("status", "/status"),
            ("reason", "/reason"),
            ("held", "/held"),
            ("item", "/item_code"),
            ("attempts", "/attempt"),
            ("http", "/http_status"),
            ("detected", "/detected/at"),
        ],
    );
    Ok(exit::OK)
}

fn attempts_table(json_out: bool, items: &[AttemptRecord]) {
    table::listing(
        json_out,
        items,
        &[
            ("attempt", "/attempt"),
            ("started", "/started_at"),
            ("outcome", "/outcome"),
            ("http", "/http_status"),
            ("host", "/push_host"),
            ("ms", "/duration_ms"),
            ("error", "/error"),
        ],
    );
}

async fn show(api: &Api, json_out: bool, id: &str) -> Result<u8, CliError> {
    let row: OutboxRow = api.get(&format!("/v1/admin/outbox/{id}"), &[]).await?;
    let attempts: AttemptList = api
        .get(&format!("/v1/admin/outbox/{id}/attempts"), &[])
        .await?;
    if json_out {
        println!("{}", json!({"row": row, "attempts": attempts.items}));
        return Ok(exit::OK);
    }
    table::fields(
        &row,
        &[
            "id",
            "channel",
            "status",
            "reason",
            "delivery",
            "item_code",
            "watch_id",
            "device_id",
            "dedup_day",
            "attempt",
            "retry_count",
            "next_attempt_at",
            "held",
            "release_at",
            "last_error",
            "http_status",
            "push_message_id",
            "replay_of",
            "replays",
            "traceparent",
        ],
    );
    println!();
    attempts_table(false, &attempts.items);
    Ok(exit::OK)
}

pub async fn attempts(api: &Api, json_out: bool, id: &str) -> Result<u8, CliError> {
    let found: AttemptList = api
        .get(&format!("/v1/admin/outbox/{id}/attempts"), &[])
        .await?;
    attempts_table(json_out, &found.items);
    Ok(exit::OK)
}

async fn stats(api: &Api, json_out: bool) -> Result<u8, CliError> {
    let s: OutboxStats = api.get("/v1/admin/outbox/stats", &[]).await?;
    if json_out {
        println!("{}", cell(&s));
        return Ok(exit::OK);
    }
    let columns = [
        ("status", "/status"),
        ("reason", "/reason"),
        ("rows", "/count"),
    ];
    table::list(&s.states, &columns);
    println!(
        "\ndue now: {} (the oldest waiting {:.0} s)",
        s.due, s.oldest_due_age_seconds
    );
    Ok(exit::OK)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Change {
    Replay,
    Cancel,
}

impl Change {
    fn verb(self) -> &'static str {
        match self {
            Change::Replay => "replay",
            Change::Cancel => "cancel",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Change::Replay => "replayed",
            Change::Cancel => "cancelled",
        }
    }
}

async fn change(
    api: &Api,
    json_out: bool,
    change: Change,
    ids: Vec<String>,
    filter: Filter,
    bulk: Bulk,
) -> Result<u8, CliError> {
    let verb = change.verb();
    if !ids.is_empty() {
        if !filter.is_empty() {
            return Err(CliError::Usage(format!(
                "give row ids or filter options to {verb}, not both"
            )));
        }
        return Ok(change_rows(api, json_out, change, ids).await);
    }
    if filter.is_empty() && !bulk.all {
        return Err(CliError::Usage(format!(
            "{verb} what? give row ids, filter options (see --help), or --all"
        )));
    }
    let path = format!("/v1/admin/outbox/{verb}");
    let filter_json = filter_body(&filter);
    let dry: BulkReport = api
        .post(
            &path,
            &json!({"filter": filter_json, "dry_run": true, "up_to": bulk.up_to}),
        )
        .await?;
    if bulk.dry_run || !bulk.yes {
        if json_out {
            println!("{}", cell(&dry));
        } else {
            print_dry_run(&dry, change, bulk.dry_run);
        }
        return Ok(exit::OK);
    }
    let total = dry.would_change.unwrap_or(0).max(0) as u64;
    let bar = if json_out {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "{verb} {{bar:40}} {{pos}}/{{len}} rows ({{elapsed}})"
    )) {
        bar.set_style(style);
    }
    let batches = Batches {
        path: &path,
        filter: &filter_json,
        batch: bulk.batch,
        up_to: dry.up_to,
    };
    let cursor = bulk.cursor.clone().map(Value::from).unwrap_or(Value::Null);
    let (examined, changed, skipped) = batches.run(api, cursor, &bar).await?;
    bar.finish_and_clear();
    let summary = json!({"examined": examined, "changed": changed, "skipped": skipped});
    if json_out {
        println!("{summary}");
    } else {
        println!("{} {changed} of {examined} matching rows", change.done());
        for (why, n) in &skipped {
            println!("  left alone: {n} {why}");
        }
    }
    Ok(exit::OK)
}

/// Row by row: each answer (or refusal) said; the exit code is the worst of them.
async fn change_rows(api: &Api, json_out: bool, change: Change, ids: Vec<String>) -> u8 {
    let verb = change.verb();
    let mut worst = exit::OK;
    for id in ids {
        let path = format!("/v1/admin/outbox/{id}/{verb}");
        let done = match change {
            Change::Replay => api.post::<Replayed>(&path, &Value::Null).await.map(|r| {
                let text = format!("{id}: replayed as {}", r.id);
                (cell(&r), text)
            }),
            Change::Cancel => (api.post::<Cancelled>(&path, &Value::Null).await)
                .map(|c| (cell(&c), format!("{id}: cancelled"))),
        };
        match done {
            Ok((json, _)) if json_out => println!("{json}"),
            Ok((_, text)) => println!("{text}"),
            Err(e) => {
                eprintln!("{id}: {}", table::shown(&e.to_string()));
                worst = worst.max(e.exit_code());
            }
        }
    }
    worst
}

/// The filter options as the api's `OutboxFilter`.
fn filter_body(filter: &Filter) -> serde_json::Map<String, Value> {
    filter
        .pairs()
        .into_iter()
        .map(|(k, v)| {
            let v = match k {
                "http_status" => v.parse::<u16>().map(Value::from).unwrap_or(Value::from(v)),
                _ => Value::from(v),
            };
            (k.to_owned(), v)
        })
        .collect()
}

/// A dry run's counts and sample, as a table.
fn print_dry_run(dry: &BulkReport, change: Change, asked_for_dry_run: bool) {
    let total = dry.would_change.unwrap_or(0);
    println!(
        "{} rows match; {total} would be {}{}",
        cell(&dry.matched),
        change.done(),
        if total > 0 { ", for example:" } else { "" }
    );
    if !dry.sample.is_empty() {
        table::list(
            &dry.sample,
            &[
                ("id", "/id"),
                ("status", "/status"),
                ("reason", "/reason"),
                ("item", "/item_code"),
                ("http", "/http_status"),
            ],
        );
    }
    if !asked_for_dry_run {
        println!("run again with --yes to {} them", change.verb());
    }
}

/// A bulk operation's calls after its dry run, each one batch.
struct Batches<'a> {
    path: &'a str,
    filter: &'a serde_json::Map<String, Value>,
    batch: u32,
    up_to: Uuid,
}

type Skipped = std::collections::BTreeMap<String, u64>;

impl Batches<'_> {
    /// Calls batch after batch from `cursor` until the api says it is done; returns the rows
    /// examined and changed, and those left alone by why. Interrupted, it says how to resume.
    async fn run(
        &self,
        api: &Api,
        mut cursor: Value,
        bar: &ProgressBar,
    ) -> Result<(u64, u64, Skipped), CliError> {
        let (mut examined, mut changed) = (0u64, 0u64);
        let mut skipped = Skipped::new();
        loop {
            let body = json!({"filter": self.filter, "batch": self.batch, "cursor": cursor, "up_to": self.up_to});
            let report: BulkReport = match api.post(self.path, &body).await {
                Ok(r) => r,
                Err(e) => {
                    bar.abandon();
                    eprintln!(
                        "stopped after {changed} rows; resume with --cursor {} --up-to {}",
                        cell(&cursor),
                        cell(&self.up_to)
                    );
                    return Err(e);
                }
            };
            examined += report.examined;
            changed += report.changed;
            bar.inc(report.changed);
            for (why, n) in report.skipped {
                *skipped.entry(why).or_default() += n;
            }
            match report.next_cursor {
                None => break,
                Some(next) => cursor = Value::from(next.to_string()),
            }
        }
        Ok((examined, changed, skipped))
    }
}
