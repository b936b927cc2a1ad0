//! `tidings dlq …`.

use crate::args::{Dlq, DlqBulk, DlqFilter};
use crate::client::{Api, CliError, exit};
use crate::table::{self, cell, shown};
use indicatif::ProgressBar;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use tidings_api_types::dead_letters::{DeadLetterDetail, DeadLetterList, DeadLetterReport};

pub async fn run(api: &Api, json_out: bool, command: Dlq) -> Result<u8, CliError> {
    match command {
        Dlq::Ls { filter, limit } => ls(api, json_out, &filter, limit).await,
        Dlq::Show { sequence } => show(api, json_out, sequence).await,
        Dlq::Redrive {
            sequences,
            filter,
            bulk,
        } => act(api, json_out, "redrive", sequences, filter, bulk).await,
        Dlq::Purge {
            sequences,
            filter,
            bulk,
        } => act(api, json_out, "purge", sequences, filter, bulk).await,
    }
}

fn query(filter: &DlqFilter) -> Vec<(&'static str, String)> {
    let mut q = Vec::new();
    if let Some(f) = &filter.from {
        q.push(("from", f.clone()));
    }
    if let Some(r) = &filter.reason {
        q.push(("reason", r.clone()));
    }
    q
}

async fn ls(api: &Api, json_out: bool, filter: &DlqFilter, limit: usize) -> Result<u8, CliError> {
    let items = api
        .list::<DeadLetterList>("/v1/admin/dlq", &query(filter), limit)
        .await?;
    table::listing(
        json_out,
        &items,
        &[
            ("sequence", "/sequence"),
            ("from", "/from"),
            ("at", "/at"),
            ("redrives", "/redrives"),
            ("msg id", "/msg_id"),
            ("reason", "/reason"),
        ],
    );
    Ok(exit::OK)
}

async fn show(api: &Api, json_out: bool, sequence: u64) -> Result<u8, CliError> {
    let d: DeadLetterDetail = api.get(&format!("/v1/admin/dlq/{sequence}"), &[]).await?;
    if json_out {
        println!("{}", cell(&d));
        return Ok(exit::OK);
    }
    table::fields(
        &d,
        &[
            "sequence",
            "from",
            "original_subject",
            "reason",
            "msg_id",
            "redrives",
            "at",
            "size",
        ],
    );
    println!("\nheaders:");
    for (name, value) in &d.headers {
        println!("  {}: {}", shown(name), shown(value));
    }
    println!("\npayload:");
    match &d.payload {
        Some(text) => println!("{}", shown(text)),
        None => println!("(base64) {}", cell(&d.payload_base64)),
    }
    Ok(exit::OK)
}

async fn act(
    api: &Api,
    json_out: bool,
    verb: &'static str,
    sequences: Vec<u64>,
    filter: DlqFilter,
    bulk: DlqBulk,
) -> Result<u8, CliError> {
    if sequences.is_empty() && filter.from.is_none() && filter.reason.is_none() && !bulk.all {
        return Err(CliError::Usage(format!(
            "{verb} what? give sequences, --from/--reason, or --all"
        )));
    }
    let path = format!("/v1/admin/dlq/{verb}");
    let mut selection = json!({"from": filter.from, "reason": filter.reason});
    if !sequences.is_empty() {
        selection["sequences"] = json!(sequences);
    }
    let dry_run = bulk.dry_run || !bulk.yes;
    let bar = if json_out || dry_run {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    let mut cursor = Value::Null;
    let (mut matched, mut done) = (0u64, 0u64);
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    let mut to: BTreeMap<String, u64> = BTreeMap::new();
    loop {
        let body = json!({"filter": selection, "dry_run": dry_run, "cursor": cursor});
        let report: DeadLetterReport = api.post(&path, &body).await?;
        matched += report.matched;
        done += report.done;
        for (why, n) in report.skipped {
            *skipped.entry(why).or_default() += n;
        }
        for (subject, n) in report.redriven_to {
            *to.entry(subject).or_default() += n;
        }
        bar.set_message(format!("{verb}: {done} of {matched}"));
        bar.tick();
        match report.next_cursor {
            None => break,
            Some(next) => cursor = Value::from(next),
        }
    }
    bar.finish_and_clear();
    let summary = json!({"dry_run": dry_run, "matched": matched, "done": done, "skipped": skipped, "redriven_to": to});
    if json_out {
        println!("{summary}");
        return Ok(exit::OK);
    }
    let would = if dry_run { "would be " } else { "" };
    let past = if verb == "redrive" {
        "redriven"
    } else {
        "purged"
    };
    println!("{matched} dead letters match; {done} {would}{past}");
    for (subject, n) in &to {
        println!("  {n} to {subject}");
    }
    for (why, n) in &skipped {
        println!("  left alone: {n} ({why})");
    }
    if dry_run && !bulk.dry_run {
        println!("run again with --yes to {verb} them");
    }
    Ok(exit::OK)
}
