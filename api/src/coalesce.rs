//! Concurrent watch creates share one statement.
//!
//! Measured with `deploy/local/stack bench api`, most of a create's database time was the
//! statement's own overhead: executor start-up, a commit and a round trip per watch. Here a
//! single task takes every create that is waiting (up to `create_batch`) and inserts them in one
//! statement, with at most a few such statements running at once. Nothing waits for a batch to
//! fill: a create that arrives at an idle api goes alone, at once, through the simpler one-create
//! statement; batches form only while earlier statements are busy, which is when they help.
//! With `create_batch` 1 there is no queue: every create is its own statement on the pool.
//!
//! Both statements keep the same promises: each create is authenticated by its token hash, and
//! no device ever exceeds its watch limit. The shared statement locks the devices it adds to (in
//! id order, so two statements cannot deadlock) and counts from the locked, latest row; the
//! one-create statement increments the counter only while it is under the limit.

use crate::problem::ApiError;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use sqlx::types::Json as SqlJson;
use std::sync::Arc;
use tidings_domain::trigger::Trigger;
use tidings_domain::{Channel, DeviceId, ItemCode, WatchId};
use tidings_store::db;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// A validated create, ready to insert.
pub struct NewWatch {
    pub item: ItemCode,
    pub triggers: Vec<Trigger>,
    pub channel: Channel,
}

/// What became of one create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Inserted for this device; `at` is its `created_at`.
    Created {
        device_id: DeviceId,
        at: DateTime<Utc>,
    },
    /// The device is at its watch limit; nothing was inserted.
    AtLimit,
    /// No live device has this token.
    UnknownToken,
}

/// One create as the statement takes it.
#[derive(Debug)]
pub struct Create {
    /// SHA-256 of the device token: the statement authenticates it.
    pub token_hash: Vec<u8>,
    pub id: WatchId,
    pub item: String,
    pub triggers: SqlJson<Vec<Trigger>>,
    pub channel: &'static str,
}

impl Create {
    pub fn new(token_hash: Vec<u8>, id: WatchId, new: &NewWatch) -> Self {
        Create {
            token_hash,
            id,
            item: new.item.as_str().to_owned(),
            triggers: SqlJson(new.triggers.clone()),
            channel: new.channel.as_str(),
        }
    }
}

struct Pending {
    create: Create,
    reply: oneshot::Sender<Result<Admission, ApiError>>,
}

/// The queue handlers put creates on. Cloning shares it.
#[derive(Clone, Debug)]
pub struct CreateQueue {
    /// `None` when every create goes alone (`create_batch` 1): straight to the pool.
    tx: Option<mpsc::Sender<Pending>>,
    pool: PgPool,
    max_watches: i32,
}

impl CreateQueue {
    /// Starts the collecting task (call within a Tokio runtime). `batch` is the most creates per
    /// statement (1: every create alone), `statements` how many run at once.
    pub fn start(pool: PgPool, max_watches: i32, batch: usize, statements: usize) -> Self {
        if batch <= 1 {
            return CreateQueue {
                tx: None,
                pool,
                max_watches,
            };
        }
        // Room for every create that can be waiting while all statements are busy.
        let (tx, rx) = mpsc::channel(batch * statements.max(1) * 4);
        tokio::spawn(collect(
            pool.clone(),
            max_watches,
            batch,
            statements.max(1),
            rx,
        ));
        CreateQueue {
            tx: Some(tx),
            pool,
            max_watches,
        }
    }

    /// Inserts watch `id` for the device holding `token_hash`, if it is under its limit.
    pub async fn create(
        &self,
        token_hash: Vec<u8>,
        id: WatchId,
        new: &NewWatch,
    ) -> Result<Admission, ApiError> {
        let create = Create::new(token_hash, id, new);
        let Some(tx) = &self.tx else {
            return Ok(insert_one(&self.pool, self.max_watches, &create)
                .await
                .map_err(db("creating a watch"))?);
        };
        let (reply, answer) = oneshot::channel();
        let gone = || ApiError::Internal(format!("watch {id}: the create queue has stopped"));
        tx.send(Pending { create, reply })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn collect(
    pool: PgPool,
    max_watches: i32,
    batch: usize,
    statements: usize,
    mut rx: mpsc::Receiver<Pending>,
) {
    let slots = Arc::new(Semaphore::new(statements));
    while let Some(first) = rx.recv().await {
        // Wait for a free statement before draining: while all are busy, creates queue up and
        // the next statement takes them together.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut creates = vec![first];
        while creates.len() < batch {
            match rx.try_recv() {
                Ok(p) => creates.push(p),
                Err(_) => break,
            }
        }
        let pool = pool.clone();
        tokio::spawn(async move {
            run(&pool, max_watches, creates).await;
            drop(slot);
        });
    }
}

/// Inserts `creates` together and answers each; a lone create takes the simpler one-create
/// statement. If Postgres refuses a shared statement, each create is retried alone, so one
/// create's problem is its own answer and not its neighbours'. If the database cannot be reached,
/// every create is told so at once rather than each waiting for the pool in turn.
async fn run(pool: &PgPool, max_watches: i32, creates: Vec<Pending>) {
    let (batch, replies): (Vec<Create>, Vec<_>) =
        creates.into_iter().map(|p| (p.create, p.reply)).unzip();
    tidings_runtime::metrics::metrics()
        .create_batch_size
        .observe(batch.len() as f64);
    if batch.len() > 1 {
        match insert(pool, max_watches, &batch).await {
            Ok(admissions) => {
                for (reply, a) in replies.into_iter().zip(admissions) {
                    let _ = reply.send(Ok(a));
                }
                return;
            }
            Err(e @ sqlx::Error::Database(_)) => {
                tracing::warn!(error = %e, creates = batch.len(), "Postgres refused a shared statement of watch creates; retrying each alone");
            }
            Err(e) => {
                let ids: Vec<String> = batch.iter().map(|c| c.id.to_string()).collect();
                tracing::error!(error = %e, watch_ids = ?ids, "a shared statement of watch creates failed");
                for reply in replies {
                    let _ = reply.send(Err(ApiError::Unavailable(
                        "the database did not answer; retry later".into(),
                    )));
                }
                return;
            }
        }
    }
    for (create, reply) in batch.iter().zip(replies) {
        let result = insert_one(pool, max_watches, create)
            .await
            .map_err(|e| ApiError::from(db("creating a watch")(e)));
        let _ = reply.send(result);
    }
}

/// The one-create statement: the device's counter moves only if the device is live, matches
/// `device` (a condition on `$2`) and is under the limit (`$6`), and the watch (`$1`, `$3`–`$5`)
/// is inserted only if it moved.
pub(crate) fn one_create_statement(device: &str, returning: &str) -> String {
    format!(
        "WITH dev AS (
             UPDATE devices SET watch_count = watch_count + 1
             WHERE {device} AND removed_at IS NULL AND watch_count < $6
             RETURNING id)
         INSERT INTO watches (id, device_id, item_code, triggers, channel)
         SELECT $1, dev.id, $3, $4, $5 FROM dev
         RETURNING {returning}"
    )
}

/// One create, one statement, authenticated by its token hash.
pub async fn insert_one(
    pool: &PgPool,
    max_watches: i32,
    create: &Create,
) -> Result<Admission, sqlx::Error> {
    let row: Option<(DeviceId, DateTime<Utc>)> = sqlx::query_as(&one_create_statement(
        "token_hash = $2",
        "device_id, created_at",
    ))
    .bind(create.id)
    .bind(&create.token_hash)
    .bind(&create.item)
    .bind(&create.triggers)
    .bind(create.channel)
    .bind(max_watches)
    .fetch_optional(pool)
    .await?;
    if let Some((device_id, at)) = row {
        return Ok(Admission::Created { device_id, at });
    }
    // Nothing inserted: an unknown token, or the limit.
    let live: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM devices WHERE token_hash = $1 AND removed_at IS NULL)",
    )
    .bind(&create.token_hash)
    .fetch_one(pool)
    .await?;
    Ok(if live {
        Admission::AtLimit
    } else {
        Admission::UnknownToken
    })
}

/// One statement for all `creates`; the answers are in the same order. Creates for one device
/// are admitted in the order given until its limit.
pub async fn insert(
    pool: &PgPool,
    max_watches: i32,
    creates: &[Create],
) -> Result<Vec<Admission>, sqlx::Error> {
    let ids: Vec<WatchId> = creates.iter().map(|p| p.id).collect();
    let hashes: Vec<&[u8]> = creates.iter().map(|p| p.token_hash.as_slice()).collect();
    let items: Vec<&str> = creates.iter().map(|p| p.item.as_str()).collect();
    let triggers: Vec<&SqlJson<Vec<Trigger>>> = creates.iter().map(|p| &p.triggers).collect();
    let channels: Vec<&str> = creates.iter().map(|p| p.channel).collect();
    let rows: Vec<(i64, DeviceId, bool, DateTime<Utc>)> = sqlx::query_as(
        "WITH req AS (
             SELECT * FROM UNNEST($1::uuid[], $2::bytea[], $3::text[], $4::jsonb[], $5::text[])
                           WITH ORDINALITY AS r(id, token_hash, item_code, triggers, channel, n)
         ), dev AS MATERIALIZED (
             SELECT d.id, d.token_hash, d.watch_count FROM devices d
             WHERE d.token_hash = ANY($2) AND d.removed_at IS NULL
             ORDER BY d.id
             FOR UPDATE
         ), ranked AS MATERIALIZED (
             SELECT req.*, dev.id AS device_id,
                    dev.watch_count + row_number() OVER (PARTITION BY dev.id ORDER BY req.n) <= $6
                        AS admitted
             FROM req JOIN dev ON dev.token_hash = req.token_hash
         ), bump AS (
             UPDATE devices d SET watch_count = d.watch_count + c.added
             FROM (SELECT device_id, count(*) AS added FROM ranked WHERE admitted
                   GROUP BY device_id) c
             WHERE d.id = c.device_id
         ), ins AS (
             INSERT INTO watches (id, device_id, item_code, triggers, channel)
             SELECT id, device_id, item_code, triggers, channel FROM ranked WHERE admitted
         )
         SELECT n, device_id, admitted, now() FROM ranked",
    )
    .bind(ids)
    .bind(hashes)
    .bind(items)
    .bind(triggers)
    .bind(channels)
    .bind(max_watches)
    .fetch_all(pool)
    .await?;
    let mut admissions = vec![Admission::UnknownToken; creates.len()];
    for (n, device_id, admitted, at) in rows {
        let slot = usize::try_from(n - 1)
            .ok()
            .and_then(|i| admissions.get_mut(i));
        if let Some(slot) = slot {
            *slot = if admitted {
                Admission::Created { device_id, at }
            } else {
                Admission::AtLimit
            };
        }
    }
    Ok(admissions)
}
