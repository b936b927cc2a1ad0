//! What Postgres says it did over a benchmark's window, from its own statistics. Postgres's CPU
//! per notification moves between identical rounds (113–180 µs a `sent` at 2,000/s on 12-07):
//! an autovacuum of the outbox inside the window accounts for ~9 µs of it, and one round in
//! twelve had the transition reading half again as many buffers. Printed beside the CPU figures,
//! these say which kind of round a figure came from.

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
        let (blocks, commits, outbox_autovacuums, outbox_autoanalyzes) = sqlx::query_as(
            "SELECT (SELECT blks_hit + blks_read FROM pg_stat_database
                     WHERE datname = current_database()),
                    (SELECT xact_commit FROM pg_stat_database
                     WHERE datname = current_database()),
                    COALESCE(sum(autovacuum_count), 0)::bigint,
                    COALESCE(sum(autoanalyze_count), 0)::bigint
             FROM pg_stat_user_tables WHERE relname LIKE 'outbox\\_%'",
        )
        .fetch_one(pool)
        .await
        .ok()?;
        Some(PgCounters {
            blocks,
            commits,
            wal_bytes: wal_position(pool).await.ok()?,
            outbox_autovacuums,
            outbox_autoanalyzes,
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
        json!({
            "buffers_per_sent": per(self.blocks, after.blocks),
            "commits_per_sent": per(self.commits, after.commits),
            "wal_bytes_per_sent": per(self.wal_bytes, after.wal_bytes).round(),
            "outbox_autovacuums": after.outbox_autovacuums - self.outbox_autovacuums,
            "outbox_autoanalyzes": after.outbox_autoanalyzes - self.outbox_autoanalyzes,
        })
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
            outbox_autovacuums: 1,
            outbox_autoanalyzes: 0,
        };
        let after = PgCounters {
            blocks: 41_000,
            commits: 30,
            wal_bytes: 3_805_000,
            outbox_autovacuums: 2,
            outbox_autoanalyzes: 1,
        };
        let w = before.per_sent(&after, 1_000);
        assert_eq!(w["buffers_per_sent"], 40.0);
        assert_eq!(w["commits_per_sent"], 0.02);
        assert_eq!(w["wal_bytes_per_sent"], 3_800.0);
        assert_eq!(w["outbox_autovacuums"], 1);
        assert_eq!(w["outbox_autoanalyzes"], 1);
        // No notification sent: per one, not a division by zero.
        assert_eq!(before.per_sent(&after, 0)["commits_per_sent"], 20.0);
        // An end that could not be read gives no figures rather than wrong ones.
        assert_eq!(PgCounters::window(None, Some(after), 1_000), Value::Null);
        assert_eq!(PgCounters::window(Some(before), None, 1_000), Value::Null);
        assert_eq!(PgCounters::window(Some(before), Some(after), 1_000), w);
    }
}
