//! What Postgres says it did over a benchmark's window, from its own statistics. Postgres's CPU
//! per notification moves between identical rounds (113–180 µs a `sent` at 2,000/s on 12-07):
//! an autovacuum of the outbox inside the window accounts for ~9 µs of it, and one round in
//! twelve had the transition reading half again as many buffers. Printed beside the CPU figures,
//! these say which kind of round a figure came from; [`Statements`] says which statements the
//! time went to.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::figures::round;

/// Cumulative counters at one moment; two of them make a window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PgCounters {
    /// Shared-buffer hits and reads in the benchmark's database.
    pub blocks: i64,
    pub commits: i64,
    /// The WAL position in bytes ([`wal_position`]).
    pub wal_bytes: i64,
    /// WAL records and full-page images written (`pg_stat_wal`: the whole server's, as
    /// `wal_bytes`; none before Postgres 14). With the row versions below they say what the
    /// bytes are: a notification's rows and their index entries, or pages logged whole after a
    /// checkpoint.
    pub wal_records_and_fpi: Option<(i64, i64)>,
    /// Row versions written in the benchmark's database: inserted, updated, and of the updated
    /// those written HOT (on the same page, with no new index entries).
    pub rows_inserted: i64,
    pub rows_updated: i64,
    pub rows_hot_updated: i64,
    /// Autovacuum and autoanalyze runs over the outbox's partitions.
    pub outbox_autovacuums: i64,
    pub outbox_autoanalyzes: i64,
}

/// Bytes Postgres has written to its WAL so far (the whole server's; a benchmark's database is
/// its only writer).
pub async fn wal_position(pool: &sqlx::PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
        .fetch_one(pool)
        .await
}

impl PgCounters {
    /// Reads the counters through `pool`, connected to the benchmark's database; `None` if they
    /// cannot be read (a benchmark's figures do not stop for its diagnostics).
    pub async fn read(pool: &sqlx::PgPool) -> Option<PgCounters> {
        // A busy backend reports its table counters about once a second, so each end of a
        // window is uncertain by up to a second's rows: a few per cent of a 40 s window.
        let (blocks, commits, autovacuums, autoanalyzes, inserted, updated, hot_updated) =
            sqlx::query_as(
                "SELECT (SELECT blks_hit + blks_read FROM pg_stat_database
                         WHERE datname = current_database()),
                        (SELECT xact_commit FROM pg_stat_database
                         WHERE datname = current_database()),
                        COALESCE(sum(autovacuum_count)
                                 FILTER (WHERE relname LIKE 'outbox\\_%'), 0)::bigint,
                        COALESCE(sum(autoanalyze_count)
                                 FILTER (WHERE relname LIKE 'outbox\\_%'), 0)::bigint,
                        COALESCE(sum(n_tup_ins), 0)::bigint,
                        COALESCE(sum(n_tup_upd), 0)::bigint,
                        COALESCE(sum(n_tup_hot_upd), 0)::bigint
                 FROM pg_stat_user_tables",
            )
            .fetch_one(pool)
            .await
            .ok()?;
        let wal_records_and_fpi = sqlx::query_as("SELECT wal_records, wal_fpi FROM pg_stat_wal")
            .fetch_one(pool)
            .await
            .ok();
        Some(PgCounters {
            blocks,
            commits,
            wal_bytes: wal_position(pool).await.ok()?,
            wal_records_and_fpi,
            rows_inserted: inserted,
            rows_updated: updated,
            rows_hot_updated: hot_updated,
            outbox_autovacuums: autovacuums,
            outbox_autoanalyzes: autoanalyzes,
        })
    }

    /// The window from `before` to `after`, per notification `sent` in it; null unless both
    /// ends were read.
    pub fn window(before: Option<PgCounters>, after: Option<PgCounters>, sent: i64) -> Value {
        match (before, after) {
            (Some(before), Some(after)) => before.per_sent(&after, sent),
            _ => Value::Null,
        }
    }

    fn per_sent(&self, after: &PgCounters, sent: i64) -> Value {
        let per = |a: i64, b: i64| round((b - a) as f64 / sent.max(1) as f64, 2);
        let wal = self.wal_records_and_fpi.zip(after.wal_records_and_fpi);
        json!({
            "buffers_per_sent": per(self.blocks, after.blocks),
            "commits_per_sent": per(self.commits, after.commits),
            "wal_bytes_per_sent": per(self.wal_bytes, after.wal_bytes).round(),
            "wal_records_per_sent": wal.map(|(b, a)| per(b.0, a.0)),
            "wal_full_page_images_per_sent": wal.map(|(b, a)| per(b.1, a.1)),
            "row_versions_per_sent": {
                "inserted": per(self.rows_inserted, after.rows_inserted),
                "updated": per(self.rows_updated, after.rows_updated),
                "of_them_hot": per(self.rows_hot_updated, after.rows_hot_updated),
            },
            "outbox_autovacuums": after.outbox_autovacuums - self.outbox_autovacuums,
            "outbox_autoanalyzes": after.outbox_autoanalyzes - self.outbox_autoanalyzes,
        })
    }
}

/// What `pg_stat_statements` counted for each statement of the benchmark's database at one
/// moment (the local stack loads it); two of them make a window, as with [`PgCounters`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Statements(HashMap<i64, Statement>);

/// One statement's cumulative counters, by its `queryid`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Statement {
    /// The normalised text's start, on one line.
    pub text: String,
    pub calls: i64,
    pub rows: i64,
    /// Time inside the executor, in milliseconds: wall time, so it includes waiting for a core.
    pub exec_ms: f64,
    pub wal_bytes: i64,
    /// Shared-buffer hits and reads.
    pub buffers: i64,
}

impl Statements {
    /// Reads every top-level statement of `pool`'s database; `None` where `pg_stat_statements`
    /// is not loaded (a Postgres the local stack did not start) or cannot be read.
    pub async fn read(pool: &sqlx::PgPool) -> Option<Statements> {
        sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .execute(pool)
            .await
            .ok()?;
        let rows: Vec<(i64, String, i64, i64, f64, i64, i64)> = sqlx::query_as(
            "SELECT queryid, left(regexp_replace(query, '\\s+', ' ', 'g'), 90), calls, rows,
                    total_exec_time, wal_bytes::bigint, shared_blks_hit + shared_blks_read
             FROM pg_stat_statements
             WHERE toplevel AND queryid IS NOT NULL
               AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        .fetch_all(pool)
        .await
        .ok()?;
        Some(Statements(
            rows.into_iter()
                .map(|(id, text, calls, rows, exec_ms, wal_bytes, buffers)| {
                    let s = Statement {
                        text,
                        calls,
                        rows,
                        exec_ms,
                        wal_bytes,
                        buffers,
                    };
                    (id, s)
                })
                .collect(),
        ))
    }

    /// The `top` statements by executor time from `before` to `after`, per notification `sent`,
    /// and the executor time of all of them; null unless both ends were read.
    pub fn window(
        before: Option<&Statements>,
        after: Option<&Statements>,
        sent: i64,
        top: usize,
    ) -> Value {
        let (Some(before), Some(after)) = (before, after) else {
            return Value::Null;
        };
        let per = |v: f64| round(v / sent.max(1) as f64, 1);
        let none = Statement::default();
        let mut ran: Vec<Statement> = (after.0.iter())
            .map(|(id, a)| {
                let b = before.0.get(id).unwrap_or(&none);
                Statement {
                    text: a.text.clone(),
                    calls: a.calls - b.calls,
                    rows: a.rows - b.rows,
                    exec_ms: a.exec_ms - b.exec_ms,
                    wal_bytes: a.wal_bytes - b.wal_bytes,
                    buffers: a.buffers - b.buffers,
                }
            })
            .filter(|s| s.calls > 0)
            .collect();
        ran.sort_by(|x, y| y.exec_ms.total_cmp(&x.exec_ms));
        let all: f64 = ran.iter().map(|s| s.exec_ms).sum();
        let listed: Vec<Value> = (ran.iter().take(top))
            .map(|s| {
                json!({
                    "statement": s.text,
                    "calls": s.calls,
                    "rows_per_call": round(s.rows as f64 / s.calls as f64, 1),
                    "exec_us_per_sent": per(s.exec_ms * 1000.0),
                    "wal_bytes_per_sent": per(s.wal_bytes as f64).round(),
                    "buffers_per_sent": per(s.buffers as f64),
                })
            })
            .collect();
        json!({ "exec_us_per_sent": per(all * 1000.0), "top": listed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_the_difference_per_sent_and_the_runs_counted() {
        let before = PgCounters {
            blocks: 1_000,
            commits: 10,
            wal_bytes: 5_000,
            wal_records_and_fpi: Some((100, 0)),
            rows_inserted: 50,
            rows_updated: 0,
            rows_hot_updated: 0,
            outbox_autovacuums: 1,
            outbox_autoanalyzes: 0,
        };
        let after = PgCounters {
            blocks: 41_000,
            commits: 30,
            wal_bytes: 3_805_000,
            wal_records_and_fpi: Some((27_100, 15)),
            rows_inserted: 3_050,
            rows_updated: 3_000,
            rows_hot_updated: 1_000,
            outbox_autovacuums: 2,
            outbox_autoanalyzes: 1,
        };
        let w = before.per_sent(&after, 1_000);
        assert_eq!(w["buffers_per_sent"], 40.0);
        assert_eq!(w["commits_per_sent"], 0.02);
        assert_eq!(w["wal_bytes_per_sent"], 3_800.0);
        assert_eq!(w["wal_records_per_sent"], 27.0);
        assert_eq!(w["wal_full_page_images_per_sent"], 0.02);
        assert_eq!(
            w["row_versions_per_sent"],
            json!({"inserted": 3.0, "updated": 3.0, "of_them_hot": 1.0})
        );
        assert_eq!(w["outbox_autovacuums"], 1);
        assert_eq!(w["outbox_autoanalyzes"], 1);
        // Without pg_stat_wal (Postgres 13) those two are null and the rest stays.
        let old_server = PgCounters {
            wal_records_and_fpi: None,
            ..before
        };
        let w13 = old_server.per_sent(&after, 1_000);
        assert_eq!(w13["wal_records_per_sent"], Value::Null);
        assert_eq!(w13["wal_full_page_images_per_sent"], Value::Null);
        assert_eq!(w13["wal_bytes_per_sent"], 3_800.0);
        // No notification sent: per one, not a division by zero.
        assert_eq!(before.per_sent(&after, 0)["commits_per_sent"], 20.0);
        // An end that could not be read gives no figures rather than wrong ones.
        assert_eq!(PgCounters::window(None, Some(after), 1_000), Value::Null);
        assert_eq!(PgCounters::window(Some(before), None, 1_000), Value::Null);
        assert_eq!(PgCounters::window(Some(before), Some(after), 1_000), w);
    }

    fn statement(text: &str, calls: i64, exec_ms: f64) -> Statement {
        Statement {
            text: text.to_owned(),
            calls,
            rows: calls * 10,
            exec_ms,
            wal_bytes: calls * 100,
            buffers: calls * 3,
        }
    }

    #[test]
    fn statements_in_a_window_are_their_differences_the_costliest_first() {
        let before = Statements(HashMap::from([
            (1, statement("UPDATE outbox", 10, 5.0)),
            (2, statement("SELECT watches", 100, 50.0)),
            (3, statement("SELECT idle", 4, 1.0)),
        ]));
        let after = Statements(HashMap::from([
            (1, statement("UPDATE outbox", 110, 105.0)),
            (2, statement("SELECT watches", 120, 60.0)),
            (3, statement("SELECT idle", 4, 1.0)),
            (4, statement("INSERT INTO outbox", 50, 30.0)),
        ]));
        let w = Statements::window(Some(&before), Some(&after), 1_000, 2);
        // 100 + 10 + 30 ms over 1,000 notifications; the statement that did not run is left out.
        assert_eq!(w["exec_us_per_sent"], 140.0);
        let top = w["top"].as_array().expect("a list");
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["statement"], "UPDATE outbox");
        assert_eq!(top[0]["calls"], 100);
        assert_eq!(top[0]["rows_per_call"], 10.0);
        assert_eq!(top[0]["exec_us_per_sent"], 100.0);
        assert_eq!(top[0]["wal_bytes_per_sent"], 10.0);
        assert_eq!(top[0]["buffers_per_sent"], 0.3);
        // New in the window: counted from zero.
        assert_eq!(top[1]["statement"], "INSERT INTO outbox");
        assert_eq!(top[1]["exec_us_per_sent"], 30.0);
        assert_eq!(
            Statements::window(None, Some(&after), 1_000, 2),
            Value::Null
        );
        assert_eq!(
            Statements::window(Some(&before), None, 1_000, 2),
            Value::Null
        );
    }
}
