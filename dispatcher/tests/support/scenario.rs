//! The dispatcher's test world: a [`World`] (database, streams, catalog) with the dispatcher's
//! settings, and its loops run in-process by hand. The dispatcher's own tests use it, and so do
//! the cross-service tests (`tidings_tests::scenario` is this file), so the dispatcher's tests
//! build without the other services.

// Each test binary that includes this file uses part of it.
#![allow(dead_code)]

use async_nats::jetstream;
use chrono::Utc;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;
use tidings_bus::consume::Handler as _;
use tidings_bus::delivered::DeliveryLog;
use tidings_dispatcher::Settings;
use tidings_dispatcher::dispatch::Dispatcher;
use tidings_dispatcher::ingest::Ingest;
use tidings_dispatcher::results::Results;
use tidings_dispatcher::sweeper::{self, SweepStats};
use tidings_domain::messages::PushRequest;
use tidings_source::Sources;
pub use tidings_testkit::world::{Watcher, World};

pub struct Scenario {
    pub world: World,
    pub settings: Settings,
}

/// A scenario is its world, with the dispatcher's parts added.
impl Deref for Scenario {
    type Target = World;
    fn deref(&self) -> &World {
        &self.world
    }
}

impl DerefMut for Scenario {
    fn deref_mut(&mut self) -> &mut World {
        &mut self.world
    }
}

impl Scenario {
    /// Settings suited to tests: short timeouts and leases, so recovery paths run in seconds.
    pub async fn new() -> Self {
        let world = World::new().await;
        let mut source = world.catalog.source_config(true);
        source.set_timeout(Duration::from_millis(500));
        let mut settings = Settings::new(world.subjects.clone(), source);
        settings.streams = world.streams.clone();
        settings.claim_lease = Duration::from_secs(1);
        settings.push_deadline = Duration::from_secs(1);
        settings.push_http_timeout = Duration::from_millis(500);
        settings.lease_margin = Duration::from_millis(250);
        settings.result_ack_wait = Duration::from_secs(1);
        settings.sending_lease = Duration::from_secs(3);
        settings.sweep_interval = Duration::from_millis(200);
        settings.poll_interval = Duration::from_millis(20);
        Scenario { world, settings }
    }

    pub fn settings(&self) -> Arc<Settings> {
        Arc::new(self.settings.clone())
    }

    pub fn dispatcher(&self) -> Dispatcher {
        self.dispatcher_on(self.js.clone(), self.settings.clone())
    }

    /// A dispatcher on another broker's `js` (a private nats-server), with `settings`.
    pub fn dispatcher_on(&self, js: jetstream::Context, settings: Settings) -> Dispatcher {
        let source = Sources::new(settings.source.clone()).expect("source");
        Dispatcher::new(
            self.db.pool.clone(),
            js,
            Arc::new(source),
            Arc::new(settings),
        )
    }

    pub async fn ingest(&self) -> Ingest {
        Ingest::new(self.db.pool.clone(), self.js.clone(), self.settings())
            .await
            .expect("ingest")
    }

    /// The delivery log the pusher writes and the sweeper reads, under this scenario's prefix.
    pub fn delivery_log(&self) -> DeliveryLog {
        DeliveryLog::new(self.js.clone(), &self.subjects, &self.settings.streams)
    }

    /// One sweep of expired leases, as the dispatcher's sweeper loop runs it.
    pub async fn sweep(&self) -> SweepStats {
        sweeper::sweep_once(&self.db.pool, &self.settings, &self.delivery_log())
            .await
            .expect("sweep")
    }

    pub async fn results(&self) -> Results {
        Results::new(self.db.pool.clone(), self.js.clone(), self.settings())
            .await
            .expect("results")
    }

    /// `w` detected at `price` now, published as the detector does, and ingested: one due row.
    pub async fn ingested(&self, w: &Watcher, price: i64) {
        let req = self.detection(w, price, Utc::now());
        self.publish_enqueue(&req, &req.dedup_key().to_string())
            .await;
        // Fetch until it is there: on a loaded cluster one short fetch can come back empty.
        let ingest = self.ingest().await;
        let started = std::time::Instant::now();
        let mut inserted = 0;
        while inserted == 0 && started.elapsed() < Duration::from_secs(10) {
            let stats = ingest
                .run_once(Duration::from_millis(300))
                .await
                .expect("ingest");
            inserted += stats.inserted;
        }
        assert_eq!(inserted, 1, "one outbox row for the detection");
    }

    /// The usual preamble: `w` detected at `price`, ingested, dispatched; returns the PushRequest
    /// a pusher would receive.
    pub async fn dispatched(&self, w: &Watcher, price: i64) -> PushRequest {
        self.ingested(w, price).await;
        self.dispatcher().dispatch_once().await.expect("dispatch");
        let mut pushes = self
            .take_pushes(&self.push_consumer().await, Duration::from_millis(300))
            .await;
        assert_eq!(pushes.len(), 1, "one PushRequest for the detection");
        pushes.remove(0)
    }
}
