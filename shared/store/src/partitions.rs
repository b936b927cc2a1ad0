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
    sqlx::query_scalar(
        r"SELECT to_date(substr(c.relname, 8), 'YYYYMMDD')
          FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
          WHERE i.inhparent = 'outbox'::regclass AND c.relname ~ '^outbox_[0-9]{8}$'
          ORDER BY 1",
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
            sqlx::query("SELECT outbox_ensure_partition($1)")
                .bind(week)
                .execute(pool)
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
