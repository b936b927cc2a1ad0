//! What a detector shard reads to scan: its active watches and their baselines, all at once on
//! the first read and only the rows written since afterwards (migration 0005 marks each row with
//! the transaction that wrote it), each read in one repeatable-read snapshot.

use crate::baselines::BaselineRow;
use sqlx::types::Json;
use sqlx::{PgPool, Postgres, Transaction};
use tidings_domain::trigger::Trigger;
use tidings_domain::{DeviceId, OutboxId, WatchId};

/// Which share of the watches a detector replica scans: those whose id hashes to `index` of
/// `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub count: i32,
    pub index: i32,
}

/// A watch as the detector reads it, with its device's time zone.
#[derive(Debug, Clone)]
pub struct ScannedWatch {
    pub id: WatchId,
    pub device_id: DeviceId,
    pub item_code: String,
    pub triggers: Json<Vec<Trigger>>,
    /// Text, so that one watch on a channel this build does not know is skipped by the detector
    /// (and logged) rather than failing the whole read.
    pub channel: String,
    pub reference_price: Option<i64>,
    pub time_zone: String,
    pub last_in_stock: Option<bool>,
    /// Whether a sent notification that stops holding is withdrawn.
    pub withdraw: bool,
    /// Not removed, not paused, and its device not removed.
    pub active: bool,
}

/// `query_as!` of the [`ScannedWatch`]es `$condition` picks in the shard (`$count`, `$index`:
/// the parameters that bind it), then `$tail`. A watch is in shard `index` of `count` when the
/// last two bytes of its id, as a number, leave `index` divided by `count`. (The compile-time
/// check reads only string literals, joined with `+`.)
macro_rules! scanned_watches {
    ($condition:tt, $count:tt, $index:tt, $tail:tt $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            ScannedWatch,
            r#"SELECT w.id AS "id: WatchId", w.device_id AS "device_id: DeviceId", w.item_code,
                      w.triggers AS "triggers: Json<Vec<Trigger>>", w.channel, w.reference_price,
                      d.time_zone, w.last_in_stock, w.withdraw,
                      (w.removed_at IS NULL AND NOT w.paused AND d.removed_at IS NULL)
                          AS "active!"
               FROM watches w JOIN devices d ON d.id = w.device_id
               WHERE "# + $condition + " AND (" + $count + "::int = 1
                    OR ((get_byte(uuid_send(w.id), 14) * 256 + get_byte(uuid_send(w.id), 15)) % "
                + $count + "::int) = " + $index + "::int) " + $tail
            $(, $arg)*
        )
    };
}

/// `query_as!` of the [`BaselineRow`]s `$condition` picks.
macro_rules! baseline_rows {
    ($condition:tt $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            BaselineRow,
            r#"SELECT watch_id AS "watch_id: WatchId", trigger, price, in_stock, sent_at,
                      outbox_id AS "outbox_id: OutboxId", dedup_day, observed_at, valid_until,
                      decided_price, decided_reference, decided_in_stock
               FROM baselines WHERE "# + $condition
            $(, $arg)*
        )
    };
}

/// One read, in one read-only repeatable-read snapshot.
pub struct Snapshot {
    tx: Transaction<'static, Postgres>,
    /// Rows written by transactions from here on are read by the next snapshot.
    /// `pg_snapshot_xmin` is cluster-wide, so a transaction running anywhere holds it back and a
    /// row may be read twice; reading an unchanged row again changes nothing.
    pub read_below: String,
}

impl Snapshot {
    pub async fn begin(pool: &PgPool) -> Result<Self, sqlx::Error> {
        let mut tx = pool.begin().await?;
        sqlx::query!("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .execute(&mut *tx)
            .await?;
        let read_below = sqlx::query_scalar!(
            r#"SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS "xmin!""#
        )
        .fetch_one(&mut *tx)
        .await?;
        Ok(Snapshot { tx, read_below })
    }

    /// The shard's active watches after `after` in (item code, id) order, at most `limit`: keyset
    /// pagination over the scan index.
    pub async fn active_after(
        &mut self,
        shard: Shard,
        after: (&str, WatchId),
        limit: i64,
    ) -> Result<Vec<ScannedWatch>, sqlx::Error> {
        scanned_watches!(
            "w.removed_at IS NULL AND NOT w.paused AND d.removed_at IS NULL
             AND (w.item_code, w.id) > ($1, $2)",
            "$4",
            "$5",
            "ORDER BY w.item_code, w.id LIMIT $3",
            after.0,
            after.1.0,
            limit,
            shard.count,
            shard.index
        )
        .fetch_all(&mut *self.tx)
        .await
    }

    /// The shard's watches written since snapshot `since` read, active or not.
    pub async fn watches_changed(
        &mut self,
        shard: Shard,
        since: &str,
    ) -> Result<Vec<ScannedWatch>, sqlx::Error> {
        scanned_watches!(
            "w.changed_xid >= $1::text::xid8",
            "$2",
            "$3",
            "",
            since,
            shard.count,
            shard.index
        )
        .fetch_all(&mut *self.tx)
        .await
    }

    /// The baselines of watches `ids`.
    pub async fn baselines_of(&mut self, ids: &[WatchId]) -> Result<Vec<BaselineRow>, sqlx::Error> {
        baseline_rows!("watch_id = ANY($1)", ids as _)
            .fetch_all(&mut *self.tx)
            .await
    }

    /// The baselines written since snapshot `since` read.
    pub async fn baselines_changed(
        &mut self,
        since: &str,
    ) -> Result<Vec<BaselineRow>, sqlx::Error> {
        baseline_rows!("changed_xid >= $1::text::xid8", since)
            .fetch_all(&mut *self.tx)
            .await
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}
