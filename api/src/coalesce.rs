//! Concurrent watch creates share one statement.
//!
//! Measured with `deploy/local/stack bench api`, most of a create's database time was the
//! statement's own overhead: executor start-up, a commit and a round trip per watch. Here a
//! single task takes every create that is waiting (up to `create_batch`) and inserts them in one
//! statement, with at most a few such statements running at once. Nothing waits for a batch to
//! fill: a create that arrives at an idle api goes alone, at once, through the simpler one-create
//! statement; batches form only while earlier statements are busy, which is when they help.
//! With `create_batch` 1 there is no queue: every create is its own statement on the pool.
//! The statements themselves, and the promises they keep, are in
//! [`tidings_store::watch_creates`].

use crate::problem::ApiError;
use sqlx::PgPool;
use std::sync::Arc;
use tidings_domain::WatchId;
use tidings_store::db;
use tidings_store::watch_creates::{self, Admission, Create, NewWatch};
use tokio::sync::{Semaphore, mpsc, oneshot};

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
            return Ok(watch_creates::one(&self.pool, self.max_watches, &create)
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
    crate::metrics::metrics()
        .create_batch_size
        .observe(batch.len() as f64);
    if batch.len() > 1 {
        match watch_creates::many(pool, max_watches, &batch).await {
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
        let result = watch_creates::one(pool, max_watches, create)
            .await
            .map_err(|e| ApiError::from(db("creating a watch")(e)));
        let _ = reply.send(result);
    }
}
