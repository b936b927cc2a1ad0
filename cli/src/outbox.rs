//! `tidings outbox …` and `tidings attempts`.

use crate::args::{Bulk, Filter, Outbox};
use crate::client::{Api, CliError, exit};
use crate::table::{self, cell};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};

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
    let items = api.list("/v1/admin/outbox", &filter.pairs(), limit).await?;
    if json_out {
        println!("{}", Value::Array(items));
        return Ok(exit::OK);
    }
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|r| {
            vec![
                cell(&r["id"]),
                cell(&r["status"]),
                cell(&r["reason"]),
                cell(&r["item_code"]),
                cell(&r["attempt"]),
                cell(&r["http_status"]),
                cell(&r["detected"]["at"]),
            ]
        })
        .collect();
    table::print(
        &[
            "id", "status", "reason", "item", "attempts", "http", "detected",
        ],
        &rows,
    );
    Ok(exit::OK)
}

fn attempts_table(items: &[Value]) {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|a| {
            vec![
                cell(&a["attempt"]),
                cell(&a["started_at"]),
                cell(&a["outcome"]),
                cell(&a["http_status"]),
                cell(&a["push_host"]),
                a["duration_ms"]
                    .as_i64()
                    .map(|ms| format!("{ms} ms"))
                    .unwrap_or_else(|| "—".into()),
                cell(&a["error"]),
            ]
        })
        .collect();
    table::print(
        &[
            "attempt", "started", "outcome", "http", "host", "took", "error",
        ],
        &rows,
    );
}

async fn show(api: &Api, json_out: bool, id: &str) -> Result<u8, CliError> {
    let row = api.get(&format!("/v1/admin/outbox/{id}"), &[]).await?;
    let attempts = api
        .get(&format!("/v1/admin/outbox/{id}/attempts"), &[])
        .await?;
    if json_out {
        println!("{}", json!({"row": row, "attempts": attempts["items"]}));
        return Ok(exit::OK);
    }
    table::fields(
        &row,
        &[
            "id",
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
            "last_error",
            "http_status",
            "push_message_id",
            "replay_of",
            "replays",
            "traceparent",
        ],
    );
    println!();
    attempts_table(
        attempts["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]),
    );
    Ok(exit::OK)
}

pub async fn attempts(api: &Api, json_out: bool, id: &str) -> Result<u8, CliError> {
    let found = api
        .get(&format!("/v1/admin/outbox/{id}/attempts"), &[])
        .await?;
    if json_out {
        println!("{}", found["items"]);
    } else {
        attempts_table(found["items"].as_array().map(Vec::as_slice).unwrap_or(&[]));
    }
    Ok(exit::OK)
}

async fn stats(api: &Api, json_out: bool) -> Result<u8, CliError> {
    let s = api.get("/v1/admin/outbox/stats", &[]).await?;
    if json_out {
        println!("{s}");
        return Ok(exit::OK);
    }
    let rows: Vec<Vec<String>> = s["states"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .map(|r| vec![cell(&r["status"]), cell(&r["reason"]), cell(&r["count"])])
        .collect();
    table::print(&["status", "reason", "rows"], &rows);
    println!(
        "\ndue now: {} (the oldest waiting {:.0} s)",
        cell(&s["due"]),
        s["oldest_due_age_seconds"].as_f64().unwrap_or(0.0)
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
    let dry = api
        .post(
            &path,
            &json!({"filter": filter_json, "dry_run": true, "up_to": bulk.up_to}),
        )
        .await?;
    if bulk.dry_run || !bulk.yes {
        if json_out {
            println!("{dry}");
        } else {
            print_dry_run(&dry, change, bulk.dry_run);
        }
        return Ok(exit::OK);
    }
    let total = dry["would_change"].as_u64().unwrap_or(0);
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
        up_to: dry["up_to"].clone(),
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
        match api
            .post(&format!("/v1/admin/outbox/{id}/{verb}"), &Value::Null)
            .await
        {
            Ok(done) if json_out => println!("{done}"),
            Ok(done) => match change {
                Change::Replay => println!("{id}: replayed as {}", cell(&done["id"])),
                Change::Cancel => println!("{id}: cancelled"),
            },
            Err(e) => {
                eprintln!("{id}: {e}");
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
fn print_dry_run(dry: &Value, change: Change, asked_for_dry_run: bool) {
    let total = dry["would_change"].as_u64().unwrap_or(0);
    println!(
        "{} rows match; {total} would be {}{}",
        cell(&dry["matched"]),
        change.done(),
        if total > 0 { ", for example:" } else { "" }
    );
    let rows: Vec<Vec<String>> = dry["sample"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
        .iter()
        .map(|r| {
            ["id", "status", "reason", "item_code", "http_status"]
                .iter()
                .map(|field| cell(&r[*field]))
                .collect()
        })
        .collect();
    if !rows.is_empty() {
        table::print(&["id", "status", "reason", "item", "http"], &rows);
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
    up_to: Value,
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
            let report = match api.post(self.path, &body).await {
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
            examined += report["examined"].as_u64().unwrap_or(0);
            let done = report["changed"].as_u64().unwrap_or(0);
            changed += done;
            bar.inc(done);
            for (why, n) in report["skipped"].as_object().into_iter().flatten() {
                *skipped.entry(why.clone()).or_default() += n.as_u64().unwrap_or(0);
            }
            match &report["next_cursor"] {
                Value::Null => break,
                next => cursor = next.clone(),
            }
        }
        Ok((examined, changed, skipped))
    }
}
