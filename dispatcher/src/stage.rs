//! What ingest and results are each built from: Postgres, JetStream (for dead letters), the
//! settings, and their own durable consumer.

use async_nats::jetstream;
use sqlx::PgPool;
use std::sync::Arc;
use tidings_bus::consume::{Consumer, ConsumerError, Durable};

use crate::config::Settings;

pub struct Stage {
    pub pool: PgPool,
    pub js: jetstream::Context,
    pub settings: Arc<Settings>,
    pub consumer: Consumer,
}

impl Stage {
    /// Binds to (creating or updating) the stage's durable consumer.
    pub async fn new(
        pool: PgPool,
        js: jetstream::Context,
        settings: Arc<Settings>,
        durable: Durable,
    ) -> Result<Self, ConsumerError> {
        let consumer = Consumer::durable(&js, &settings.subjects, durable).await?;
        Ok(Stage {
            pool,
            js,
            settings,
            consumer,
        })
    }
}
