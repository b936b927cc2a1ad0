//! The outbox's weekly partitions (migration 0010), as the services read them: the dispatcher's
//! retention round lists them; the api says how far back history reaches.

use chrono::NaiveDate;
use sqlx::PgPool;
use std::collections::HashSet;
use std::sync::Mutex;
use tidings_domain::retention;

/// Whether Postgres refused a row because no partition takes its day (a week dropped, or never
/// made): a check violation that names no constraint, told apart by code, not by its text.
pub fn is_missing(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d)
        if d.code().as_deref() == Some("23514") && d.constraint().is_none())
}

/// The Monday of every week the outbox has a partition for, oldest first.
pub async fn weeks<'c, E: sqlx::PgExecutor<'c>>(e: E) -> Result<Vec<NaiveDate>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT to_date(substr(c.relname, 8), 'YYYYMMDD') AS "week!"
           FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
           WHERE i.inhparent = 'outbox'::regclass AND c.relname ~ '^outbox_[0-9]{8}$'
           ORDER BY 1"#
    )
    .fetch_all(e)
    .await
}

/// The first dedup day the outbox still holds rows of (the oldest partition's Monday): older
/// notifications have left with their week. `None` before any partition exists.
pub async fn kept_from<'c, E: sqlx::PgExecutor<'c>>(
    e: E,
) -> Result<Option<NaiveDate>, sqlx::Error> {
    Ok(weeks(e).await?.first().copied())
}

/// The weeks ingest knows have a partition, so it asks the database only for a new one.
#[derive(Default)]
pub struct Partitions {
    known: Mutex<HashSet<NaiveDate>>,
}

impl Partitions {
    /// Makes sure each of `days`' weeks has a partition.
    pub async fn ensure(
        &self,
        pool: &PgPool,
        days: impl IntoIterator<Item = NaiveDate>,
    ) -> Result<(), sqlx::Error> {
        let missing: HashSet<NaiveDate> = {
            let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            days.into_iter()
                .map(retention::week_of)
                .filter(|w| !known.contains(w))
                .collect()
        };
        for week in missing {
            sqlx::query_scalar!("SELECT outbox_ensure_partition($1)", week)
                .fetch_one(pool)
                .await?;
            self.known
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(week);
        }
        Ok(())
    }

    /// Forgets what it knew (a week was dropped under it): the next batch asks again.
    pub fn forget(&self) {
        self.known.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// Whether each week the outbox has a partition for still holds a row to be decided. Asked only
/// of weeks `expired` says are past retention; the others are kept whatever they hold.
pub async fn with_undecided_rows(
    conn: &mut sqlx::PgConnection,
    expired: impl Fn(NaiveDate) -> bool,
) -> Result<Vec<(NaiveDate, bool)>, sqlx::Error> {
    let found = weeks(&mut *conn).await?;
    let mut out = Vec::with_capacity(found.len());
    for week in found {
        let live = expired(week)
            && sqlx::query_scalar!(
                r#"SELECT EXISTS (
                       SELECT 1 FROM outbox WHERE dedup_day >= $1 AND dedup_day < $1 + 7
                         AND status IN ('pending', 'retry', 'sending') /* status: undecided */
                   ) AS "live!""#,
                week
            )
            .fetch_one(&mut *conn)
            .await?;
        out.push((week, live));
    }
    Ok(out)
}

/// Takes the transaction-scoped lock named `key`; false if another session holds it.
pub async fn try_lock(conn: &mut sqlx::PgConnection, key: &str) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT pg_try_advisory_xact_lock(hashtext($1)) AS "locked!""#,
        key
    )
    .fetch_one(conn)
    .await
}

/// Makes the partition of `week`; true if it was not there.
pub async fn create(conn: &mut sqlx::PgConnection, week: NaiveDate) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT outbox_ensure_partition($1) AS "created!""#, week)
        .fetch_one(conn)
        .await
}

/// What [`drop_expired`] did with a week.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropOutcome {
    Dropped,
    /// A row in it is still to be decided (it became so after the week was listed).
    Kept,
    /// There was no such partition.
    Absent,
}

#[derive(Debug, thiserror::Error)]
pub enum DropError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error("outbox_drop_partition({week}) answered {answer:?}, which this build does not know")]
    Unknown { week: NaiveDate, answer: String },
}

/// Drops the partition of `week` if every day of it is older than `retention_days` and none of
/// its rows is undecided; the database function checks both again.
pub async fn drop_expired(
    conn: &mut sqlx::PgConnection,
    week: NaiveDate,
    retention_days: u32,
) -> Result<DropOutcome, DropError> {
    // A retention beyond `i32` days keeps everything, as the largest `i32` does.
    let days = i32::try_from(retention_days).unwrap_or(i32::MAX);
    let answer = sqlx::query_scalar!(
        r#"SELECT outbox_drop_partition($1, $2) AS "answer!""#,
        week,
        days
    )
    .fetch_one(conn)
    .await?;
    match answer.as_str() {
        "dropped" => Ok(DropOutcome::Dropped),
        "kept" => Ok(DropOutcome::Kept),
        "absent" => Ok(DropOutcome::Absent),
        _ => Err(DropError::Unknown { week, answer }),
    }
}

/// Rows of each kind deleted for good.
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
pub struct Purged {
    pub watches: i64,
    pub subscriptions: i64,
    pub devices: i64,
}

/// Deletes up to `batch` of each kind removed long enough ago that no retained outbox row refers
/// to it (the database function decides, from the oldest week it holds).
pub async fn purge_removed_batch(pool: &PgPool, batch: i32) -> Result<Purged, sqlx::Error> {
    sqlx::query_as!(
        Purged,
        r#"SELECT watches AS "watches!", subscriptions AS "subscriptions!",
                  devices AS "devices!"
           FROM tidings_purge_removed($1)"#,
        batch
    )
    .fetch_one(pool)
    .await
}
