//! The detector against real Postgres and NATS, with the fake catalog as the source.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use chrono::{Duration as ChronoDuration, TimeZone, Utc};
use std::time::Duration;
use tidings_bus::streams::{StreamSettings, ensure_streams};
use tidings_detector::Settings;
use tidings_detector::hold::{Gate, Hold};
use tidings_detector::scan::Detector;
use tidings_domain::messages::EnqueueRequest;
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::Trigger;
use tidings_source::Sources;
use tidings_testkit::fake_catalog::{Behavior, Item};
use tidings_testkit::world::World;
use tokio_util::sync::CancellationToken;

fn detector(s: &World, shard_index: u32, shard_count: u32) -> Detector {
    let mut source = s.catalog.source_config(true);
    source.set_timeout(Duration::from_millis(500));
    let mut settings = Settings::new(s.subjects.clone(), source);
    settings.shard_index = shard_index;
    settings.shard_count = shard_count;
    settings.page_size = 1000;
    settings.validate().unwrap();
    let source = Sources::new(settings.source.clone()).unwrap();
    Detector::new(s.db.pool.clone(), s.js.clone(), source, settings)
}

#[tokio::test]
async fn a_price_below_threshold_is_enqueued_once_a_day() {
    let s = World::new().await;
    s.watcher("SKU-1", Trigger::PriceBelow { threshold: 1200 }, 1100)
        .await;
    let d = detector(&s, 0, 1);
    let day1 = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();

    let first = d.scan_once(day1).await.unwrap();
    assert_eq!((first.watches, first.holding, first.published), (1, 1, 1));
    for later in [1, 2] {
        let again = d
            .scan_once(day1 + ChronoDuration::minutes(later))
            .await
            .unwrap();
        assert_eq!(
            (again.evaluated, again.holding, again.published),
            (0, 0, 0),
            "same day, same price: enqueued, so nothing is evaluated or republished"
        );
    }
    // The price moves but still holds: evaluated again, the same dedup key, remembered.
    s.catalog.set_price("SKU-1", 1050);
    let moved = d
        .scan_once(day1 + ChronoDuration::minutes(3))
        .await
        .unwrap();
    assert_eq!(
        (
            moved.evaluated,
            moved.holding,
            moved.remembered,
            moved.published
        ),
        (1, 1, 1, 0),
        "same day, not republished"
    );
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 1);
    // Past the republish interval (10 min) a trigger that still holds is published again, in
    // case JetStream lost it; here it did not, and its duplicate window drops the repeat.
    let republished = d.scan_once(day1 + ChronoDuration::hours(1)).await.unwrap();
    assert_eq!((republished.published, republished.duplicates), (0, 1));
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 1);

    // A restarted detector has no memory: it publishes once more and JetStream drops it.
    let restarted = detector(&s, 0, 1)
        .scan_once(day1 + ChronoDuration::hours(3))
        .await
        .unwrap();
    assert_eq!((restarted.published, restarted.duplicates), (0, 1));
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 1);

    let next_day = d.scan_once(day1 + ChronoDuration::days(1)).await.unwrap();
    assert_eq!(next_day.published, 1);
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 2);
    s.cleanup().await;
}

/// Triggers found together travel in one message, and re-published together (trusted until the
/// same scan) they are that message again, which JetStream's duplicate window drops.
#[tokio::test]
async fn triggers_found_together_are_one_message_and_their_republish_a_duplicate() {
    let s = World::new().await;
    for threshold in [1200, 1300, 1400] {
        s.watcher("SKU-1", Trigger::PriceBelow { threshold }, 1100)
            .await;
    }
    let d = detector(&s, 0, 1);
    let t = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();
    let first = d.scan_once(t).await.unwrap();
    assert_eq!((first.holding, first.published), (3, 3));
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 1, "one batch");
    assert_eq!(s.enqueued().await.len(), 3);

    let again = d.scan_once(t + ChronoDuration::minutes(11)).await.unwrap();
    assert_eq!((again.published, again.duplicates), (0, 3));
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 1);
    s.cleanup().await;
}

#[tokio::test]
async fn price_drop_fires_at_ten_percent_and_then_needs_ten_more_after_a_send() {
    let s = World::new().await;
    let w = s
        .watcher("SKU-1", Trigger::PriceDrop { percent: 10 }, 1000)
        .await;
    let d = detector(&s, 0, 1);
    let t0 = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();

    s.catalog.set_price("SKU-1", 910);
    assert_eq!(d.scan_once(t0).await.unwrap().holding, 0, "9 % is not 10 %");
    s.catalog.set_price("SKU-1", 900);
    assert_eq!(d.scan_once(t0).await.unwrap().published, 1);

    // The notification at 900 was sent: the baseline is now 900.
    sqlx::query(
        "INSERT INTO baselines (watch_id, trigger, price, in_stock, outbox_id, sent_at)
         VALUES ($1, 'price_drop:10', 900, true, gen_random_uuid(), now())",
    )
    .bind(w.watch)
    .execute(&s.db.pool)
    .await
    .unwrap();
    let t1 = t0 + ChronoDuration::days(1);
    s.catalog.set_price("SKU-1", 850);
    assert_eq!(
        d.scan_once(t1).await.unwrap().holding,
        0,
        "850 is not 10 % below 900"
    );
    s.catalog.set_price("SKU-1", 810);
    assert_eq!(d.scan_once(t1).await.unwrap().published, 1);
    s.cleanup().await;
}

#[tokio::test]
async fn price_drop_without_a_reference_measures_from_the_first_price_seen() {
    let s = World::new().await;
    let w = s
        .watcher("SKU-1", Trigger::PriceDrop { percent: 10 }, 1000)
        .await;
    // As the api creates it: no reference price yet.
    sqlx::query("UPDATE watches SET reference_price = NULL WHERE id = $1")
        .bind(w.watch)
        .execute(&s.db.pool)
        .await
        .unwrap();
    let d = detector(&s, 0, 1);
    let t0 = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();

    assert_eq!(d.scan_once(t0).await.unwrap().holding, 0);
    let reference: Option<i64> =
        sqlx::query_scalar("SELECT reference_price FROM watches WHERE id = $1")
            .bind(w.watch)
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(reference, Some(1000));

    s.catalog.set_price("SKU-1", 1100);
    d.scan_once(t0).await.unwrap();
    s.catalog.set_price("SKU-1", 900);
    assert_eq!(
        d.scan_once(t0).await.unwrap().published,
        1,
        "10 % below the first price; the later 1100 did not move the reference"
    );
    s.cleanup().await;
}

/// Both of a scan's watch writes in one statement: a watch that needs its stock state and its
/// reference price recorded in the same scan gets both, and a reference already set stays.
#[tokio::test]
async fn one_scan_records_a_watch_s_stock_state_and_first_price_together() {
    let s = World::new().await;
    let w = s.watcher("SKU-1", Trigger::BackInStock, 1000).await;
    let kept = s
        .watcher("SKU-1", Trigger::PriceDrop { percent: 10 }, 1000)
        .await;
    sqlx::query(
        "UPDATE watches SET reference_price = NULL,
                triggers = '[{\"kind\":\"back_in_stock\"},{\"kind\":\"price_drop\",\"percent\":10}]'
         WHERE id = $1",
    )
    .bind(w.watch)
    .execute(&s.db.pool)
    .await
    .unwrap();
    s.catalog.set_price("SKU-1", 1250);
    detector(&s, 0, 1).scan_once(Utc::now()).await.unwrap();
    let row = |id| {
        let pool = s.db.pool.clone();
        async move {
            sqlx::query_as::<_, (Option<bool>, Option<i64>)>(
                "SELECT last_in_stock, reference_price FROM watches WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(row(w.watch).await, (Some(true), Some(1250)));
    assert_eq!(
        row(kept.watch).await,
        (None, Some(1000)),
        "set before: kept"
    );
    s.cleanup().await;
}

#[tokio::test]
async fn back_in_stock_fires_on_the_out_to_in_transition_only() {
    let s = World::new().await;
    s.watcher("SKU-1", Trigger::BackInStock, 1000).await;
    let d = detector(&s, 0, 1);
    let t = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();

    assert_eq!(
        d.scan_once(t).await.unwrap().holding,
        0,
        "in stock at the first look: nothing changed"
    );
    s.catalog.set_in_stock("SKU-1", false);
    assert_eq!(d.scan_once(t).await.unwrap().holding, 0, "in → out");
    s.catalog.set_in_stock("SKU-1", true);
    assert_eq!(d.scan_once(t).await.unwrap().published, 1, "out → in");
    assert_eq!(
        d.scan_once(t + ChronoDuration::days(1))
            .await
            .unwrap()
            .holding,
        0,
        "still in stock: no news"
    );
    s.cleanup().await;
}

#[tokio::test]
async fn a_failing_item_does_not_stop_the_others() {
    let s = World::new().await;
    s.watcher("BROKEN", Trigger::PriceBelow { threshold: 1200 }, 1100)
        .await;
    s.watcher("FINE", Trigger::PriceBelow { threshold: 1200 }, 1100)
        .await;
    s.catalog.set(
        "BROKEN",
        Item {
            behavior: Behavior::ServerError,
            ..Item::priced(1100)
        },
    );
    let stats = detector(&s, 0, 1).scan_once(Utc::now()).await.unwrap();
    assert_eq!(
        (stats.watches, stats.source_errors, stats.published),
        (2, 1, 1)
    );
    s.cleanup().await;
}

#[tokio::test]
async fn two_shards_enqueue_each_holding_watch_exactly_once() {
    let s = World::new().await;
    let w = s
        .watcher("SKU-0", Trigger::PriceBelow { threshold: 1200 }, 1100)
        .await;
    // 9,999 more watches of the same device over 100 items, all below their threshold.
    sqlx::query(
        "INSERT INTO watches (id, device_id, item_code, triggers, reference_price)
         SELECT gen_random_uuid(), $1, 'SKU-' || (g % 100), '[{\"kind\":\"price_below\",\"threshold\":1200}]', 1100
         FROM generate_series(1, 9999) g",
    )
    .bind(w.device.id)
    .execute(&s.db.pool)
    .await
    .unwrap();
    for i in 0..100 {
        s.catalog.set_price(&format!("SKU-{i}"), 1100);
    }
    let now = Utc::now();
    let (d0, d1) = (detector(&s, 0, 2), detector(&s, 1, 2));
    let (a, b) = tokio::join!(d0.scan_once(now), d1.scan_once(now));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.watches + b.watches, 10_000, "no gaps");
    assert!(
        a.watches > 4_000 && b.watches > 4_000,
        "shards are balanced: {} / {}",
        a.watches,
        b.watches
    );
    assert_eq!((a.duplicates, b.duplicates), (0, 0), "no overlap");
    assert_eq!(a.published + b.published, 10_000);
    let enqueued = s.enqueued().await;
    let keys: std::collections::HashSet<_> = enqueued.iter().map(|r| r.dedup_key()).collect();
    assert_eq!((enqueued.len(), keys.len()), (10_000, 10_000));
    // New detections travel 50 to a message (a page's last batch of a channel may be short).
    let messages = s.stream_len(StreamKind::Enqueue).await;
    assert!(
        (200..=260).contains(&messages),
        "{messages} messages for 10,000 requests"
    );
    s.cleanup().await;
}

#[tokio::test]
async fn each_item_is_fetched_once_per_scan_even_across_pages() {
    let s = World::new().await;
    let w = s
        .watcher("ITEM-0", Trigger::PriceBelow { threshold: 1200 }, 1100)
        .await;
    // 49 more watches over 5 items, read 7 at a time: items straddle page boundaries.
    sqlx::query(
        "INSERT INTO watches (id, device_id, item_code, triggers, reference_price)
         SELECT gen_random_uuid(), $1, 'ITEM-' || (g % 5), '[{\"kind\":\"price_below\",\"threshold\":1200}]', 1100
         FROM generate_series(1, 49) g",
    )
    .bind(w.device.id)
    .execute(&s.db.pool)
    .await
    .unwrap();
    for i in 0..5 {
        s.catalog.set_price(&format!("ITEM-{i}"), 1100);
    }
    let mut settings = Settings::new(s.subjects.clone(), s.catalog.source_config(false));
    settings.page_size = 7;
    let source = Sources::new(settings.source.clone()).unwrap();
    let d = Detector::new(s.db.pool.clone(), s.js.clone(), source, settings);
    let stats = d.scan_once(Utc::now()).await.unwrap();
    assert_eq!((stats.watches, stats.items, stats.published), (50, 5, 50));
    assert_eq!(
        s.catalog.requests(),
        (5, 0),
        "one request per item for the whole scan"
    );
    s.cleanup().await;
}

#[tokio::test]
async fn stock_state_is_kept_only_where_back_in_stock_needs_it() {
    let s = World::new().await;
    let price = s
        .watcher("SKU-1", Trigger::PriceBelow { threshold: 1200 }, 1100)
        .await;
    let stock = s.watcher("SKU-1", Trigger::BackInStock, 1100).await;
    detector(&s, 0, 1).scan_once(Utc::now()).await.unwrap();
    let state = |id| {
        let pool = s.db.pool.clone();
        async move {
            sqlx::query_scalar::<_, Option<bool>>("SELECT last_in_stock FROM watches WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        state(price.watch).await,
        None,
        "no write for a watch that never reads it"
    );
    assert_eq!(state(stock.watch).await, Some(true));
    s.cleanup().await;
}

#[tokio::test]
async fn a_dry_run_publishes_and_writes_nothing() {
    let s = World::new().await;
    let w = s.watcher("SKU-1", Trigger::BackInStock, 1100).await;
    sqlx::query("UPDATE watches SET last_in_stock = false WHERE id = $1")
        .bind(w.watch)
        .execute(&s.db.pool)
        .await
        .unwrap();
    let mut settings = Settings::new(s.subjects.clone(), s.catalog.source_config(true));
    settings.dry_run = true;
    let source = Sources::new(settings.source.clone()).unwrap();
    let d = Detector::new(s.db.pool.clone(), s.js.clone(), source, settings);
    let stats = d.scan_once(Utc::now()).await.unwrap();
    assert_eq!(
        (stats.holding, stats.published),
        (1, 1),
        "reported as would-be published"
    );
    assert_eq!(
        s.stream_len(StreamKind::Enqueue).await,
        0,
        "nothing reached the stream"
    );
    let state: Option<bool> = sqlx::query_scalar("SELECT last_in_stock FROM watches WHERE id = $1")
        .bind(w.watch)
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(state, Some(false), "no state written");
    s.cleanup().await;
}

#[tokio::test]
async fn later_scans_read_only_what_changed_and_see_every_change() {
    let s = World::new().await;
    let below = Trigger::PriceBelow { threshold: 1200 };
    let a = s.watcher("SKU-1", below.clone(), 1300).await;
    let b = s.watcher("SKU-2", below.clone(), 1300).await;
    let d = detector(&s, 0, 1);
    let t = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();

    let first = d.scan_once(t).await.unwrap();
    assert_eq!(
        (
            first.watches,
            first.rows_read,
            first.evaluated,
            first.holding
        ),
        (2, 2, 2, 0)
    );
    let mut idle = d.scan_once(t).await.unwrap();
    assert_eq!(
        (idle.watches, idle.items, idle.evaluated),
        (2, 2, 0),
        "nothing changed: every item fetched, nothing evaluated"
    );
    // A transaction running elsewhere in the cluster (other tests' databases) can hold the read
    // point back, so the watches may be read once more, unchanged; soon nothing is read.
    for _ in 0..100 {
        if idle.rows_read == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        idle = d.scan_once(t).await.unwrap();
        assert_eq!(
            idle.evaluated, 0,
            "rows read again unchanged change nothing"
        );
    }
    assert_eq!(idle.rows_read, 0, "nothing changed: nothing read");

    s.catalog.set_price("SKU-1", 1100);
    let moved = d.scan_once(t).await.unwrap();
    assert_eq!(
        (moved.rows_read, moved.evaluated, moved.published),
        (0, 1, 1),
        "only the item whose price moved"
    );

    // The api pauses b, a new watch c arrives on an item already below, and a's notification is
    // sent (its baseline moves to 1100).
    sqlx::query("UPDATE watches SET paused = true, updated_at = now() WHERE id = $1")
        .bind(b.watch)
        .execute(&s.db.pool)
        .await
        .unwrap();
    s.catalog.set_price("SKU-2", 1100);
    let c = s.watcher("SKU-3", below.clone(), 1100).await;
    sqlx::query(
        "INSERT INTO baselines (watch_id, trigger, price, in_stock, outbox_id, sent_at)
         VALUES ($1, 'price_below:1200', 1100, true, gen_random_uuid(), now())",
    )
    .bind(a.watch)
    .execute(&s.db.pool)
    .await
    .unwrap();
    let changed = d.scan_once(t).await.unwrap();
    assert_eq!(
        (changed.watches, changed.holding, changed.published),
        (2, 1, 1),
        "b paused, c published, a not again: 1100 is not below its baseline of 1100"
    );
    let published: Vec<String> = s
        .enqueued()
        .await
        .into_iter()
        .map(|r| r.watch_id.to_string())
        .collect();
    assert_eq!(published, [a.watch.to_string(), c.watch.to_string()]);

    sqlx::query("UPDATE watches SET paused = false, updated_at = now() WHERE id = $1")
        .bind(b.watch)
        .execute(&s.db.pool)
        .await
        .unwrap();
    // As the api removes a device: its watches in the same statement.
    sqlx::query(
        "WITH d AS (UPDATE devices SET removed_at = now() WHERE id = $1 RETURNING id)
         UPDATE watches SET removed_at = now(), updated_at = now() WHERE device_id IN (SELECT id FROM d)",
    )
    .bind(c.device.id)
    .execute(&s.db.pool)
    .await
    .unwrap();
    let resumed = d.scan_once(t).await.unwrap();
    assert_eq!(
        (resumed.watches, resumed.published),
        (2, 1),
        "b resumed and published; c's device is gone"
    );
    s.cleanup().await;
}

#[tokio::test]
async fn a_change_committed_after_a_later_one_was_read_is_still_seen() {
    let s = World::new().await;
    let a = s
        .watcher("SKU-1", Trigger::PriceBelow { threshold: 1200 }, 1300)
        .await;
    let d = detector(&s, 0, 1);
    let t = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();
    assert_eq!(d.scan_once(t).await.unwrap().holding, 0);

    // A slow transaction raises a's threshold above the price; before it commits, a newer
    // transaction adds a watch and commits, and a scan reads that one.
    let mut slow = s.db.pool.begin().await.unwrap();
    sqlx::query(
        "UPDATE watches SET triggers = '[{\"kind\":\"price_below\",\"threshold\":1400}]' WHERE id = $1",
    )
    .bind(a.watch)
    .execute(&mut *slow)
    .await
    .unwrap();
    s.watcher("SKU-2", Trigger::PriceBelow { threshold: 1200 }, 1300)
        .await;
    let between = d.scan_once(t).await.unwrap();
    assert_eq!((between.watches, between.holding), (2, 0));
    slow.commit().await.unwrap();

    let after = d.scan_once(t).await.unwrap();
    assert_eq!(
        (after.holding, after.published),
        (1, 1),
        "the slow transaction's change is read though a newer one was read before it committed"
    );
    s.cleanup().await;
}

#[tokio::test]
async fn a_trigger_whose_enqueue_request_was_lost_is_published_again() {
    let s = World::new().await;
    s.watcher("SKU-1", Trigger::PriceBelow { threshold: 1200 }, 1100)
        .await;
    let d = detector(&s, 0, 1);
    let t = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();
    assert_eq!(d.scan_once(t).await.unwrap().published, 1);

    // JetStream loses the acknowledged message, and with it the message id its duplicate window
    // would have matched (a crash under lazy fsync): the stream is deleted and made again.
    s.js.delete_stream(s.subjects.stream(StreamKind::Enqueue))
        .await
        .unwrap();
    ensure_streams(&s.js, &s.subjects, &StreamSettings::default())
        .await
        .unwrap();
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 0);

    let soon = d.scan_once(t + ChronoDuration::minutes(5)).await.unwrap();
    assert_eq!(soon.published, 0, "within the republish interval: trusted");
    let later = d.scan_once(t + ChronoDuration::minutes(11)).await.unwrap();
    assert_eq!(
        (later.holding, later.published),
        (1, 1),
        "still holding after the republish interval: published again"
    );
    assert_eq!(s.stream_len(StreamKind::Enqueue).await, 1);
    s.cleanup().await;
}

/// A watch removed long ago and then purged for good (the dispatcher's retention round deletes
/// it once no retained outbox row can refer to it) leaves a running detector as it was: the
/// removal already took it out of the watchlist, and the scans after the purge go on.
#[tokio::test]
async fn a_purged_watch_leaves_the_detector_running() {
    let s = World::new().await;
    let kept = s
        .watcher("SKU-1", Trigger::PriceBelow { threshold: 1200 }, 1500)
        .await;
    let removed = s
        .watcher("SKU-2", Trigger::PriceBelow { threshold: 1200 }, 1500)
        .await;
    let d = detector(&s, 0, 1);
    let t0 = Utc::now();
    assert_eq!(d.scan_once(t0).await.unwrap().watches, 2);
    sqlx::query("UPDATE watches SET removed_at = now() - interval '60 days' WHERE id = $1")
        .bind(removed.watch)
        .execute(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(
        d.scan_once(t0 + ChronoDuration::seconds(1))
            .await
            .unwrap()
            .watches,
        1
    );
    let purged: i64 = sqlx::query_scalar("SELECT watches FROM tidings_purge_removed(100)")
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(purged, 1);
    assert_eq!(
        s.db.count("SELECT count(*) FROM watches").await,
        1,
        "only the removed watch went"
    );
    let after = d.scan_once(t0 + ChronoDuration::seconds(2)).await.unwrap();
    assert_eq!((after.watches, after.published), (1, 0));
    // The watch that stays still notifies.
    s.catalog.set_price(&kept.item, 1000);
    let dropped = d.scan_once(t0 + ChronoDuration::seconds(3)).await.unwrap();
    assert_eq!((dropped.watches, dropped.published), (1, 1));
    s.cleanup().await;
}

/// Dispatch behind: scans wait while more than the limit waits in the enqueue stream for ingest,
/// and once ingest has taken the backlog, the first scan finds what began during the wait.
#[tokio::test]
async fn scans_wait_while_the_enqueue_backlog_is_deep_and_then_find_what_changed() {
    let s = World::new().await;
    let filler = s
        .watcher("SKU-F", Trigger::PriceBelow { threshold: 1200 }, 1500)
        .await;
    let w = s
        .watcher("SKU-1", Trigger::PriceBelow { threshold: 1200 }, 1500)
        .await;
    // The ingest consumer exists (as once a dispatcher has started) and 30 messages wait for it.
    let ingest = s.ingest_consumer().await;
    let t = Utc::now();
    for i in 0..30 {
        let req = s.detection(&filler, 1100 - i, t);
        assert!(!s.publish_enqueue(&req, &format!("filler-{i}")).await);
    }
    let limit = 10;
    let mut hold = Hold::new(s.js.clone(), &s.subjects, limit);
    assert_eq!(hold.check().await, Gate::Wait, "30 waiting, limit 10");

    let stop = tokio_util::sync::CancellationToken::new();
    let d = std::sync::Arc::new(detector(&s, 0, 1));
    let run = tokio::spawn({
        let (d, stop) = (d.clone(), stop.clone());
        async move { d.run(Duration::from_millis(100), hold, stop).await }
    });
    s.catalog.set_price("SKU-1", 1100);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let enqueued = s.enqueued().await;
    assert_eq!(enqueued.len(), 30, "held: nothing published");
    assert!(enqueued.iter().all(|r| r.watch_id == filler.watch));

    // Ingest (played here) takes the backlog; the detector resumes and its first scan finds
    // SKU-1 below the threshold and publishes it.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    let mut taken = Vec::new();
    while !taken.iter().any(|r: &EnqueueRequest| r.watch_id == w.watch)
        && std::time::Instant::now() < until
    {
        taken.extend(s.take_enqueues(&ingest, Duration::from_millis(200)).await);
    }
    taken.extend(s.take_enqueues(&ingest, Duration::from_millis(500)).await);
    let found: Vec<&EnqueueRequest> = taken.iter().filter(|r| r.watch_id == w.watch).collect();
    assert_eq!(found.len(), 1, "found after the hold, once");
    assert_eq!(found[0].detected.price, 1100);
    stop.cancel();
    run.await.unwrap();
    s.cleanup().await;
}

/// A backlog that cannot be read (here: no dispatcher has created its consumer yet) never stops
/// the scans; a scan may publish the room left under the limit; a zero limit never even looks.
#[tokio::test]
async fn a_backlog_that_cannot_be_read_does_not_hold_scans() {
    let s = World::new().await;
    assert!(
        s.consumer(StreamKind::Enqueue, "dispatcher-ingest")
            .await
            .is_none()
    );
    assert_eq!(
        Hold::new(s.js.clone(), &s.subjects, 5).check().await,
        Gate::Scan { budget: Some(5) },
        "nothing can be waiting for a consumer that does not exist"
    );
    s.ingest_consumer().await;
    let w = s
        .watcher("SKU-1", Trigger::PriceBelow { threshold: 1200 }, 1100)
        .await;
    for (price, id) in [(1100, "a"), (1000, "b")] {
        assert!(
            !s.publish_enqueue(&s.detection(&w, price, Utc::now()), id)
                .await
        );
    }
    // JetStream updates a consumer's pending count a moment after the store (CI saw 0 once,
    // under load): wait for it to count both, then check what the hold makes of them.
    let counted = std::time::Instant::now() + Duration::from_secs(5);
    while s.unacked(StreamKind::Enqueue, "dispatcher-ingest").await < 2
        && std::time::Instant::now() < counted
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        Hold::new(s.js.clone(), &s.subjects, 1).check().await,
        Gate::Wait
    );
    assert_eq!(
        Hold::new(s.js.clone(), &s.subjects, 5).check().await,
        Gate::Scan { budget: Some(3) },
        "two of five waiting: room for three"
    );
    assert_eq!(
        Hold::new(s.js.clone(), &s.subjects, 0).check().await,
        Gate::Scan { budget: None }
    );
    // Messages of a batching detector count as full batches: two of three each are six.
    assert_eq!(
        Hold::new(s.js.clone(), &s.subjects, 10)
            .counting_each_message_as(3)
            .check()
            .await,
        Gate::Scan { budget: Some(4) },
        "six of ten waiting: room for four"
    );
    assert_eq!(
        Hold::new(s.js.clone(), &s.subjects, 5)
            .counting_each_message_as(3)
            .check()
            .await,
        Gate::Wait
    );
    s.cleanup().await;
}

/// A scan publishes no more than its budget; what holds past it is published by later scans, each
/// starting at the item where the last one stopped (so a trigger that began meanwhile on an
/// earlier item does not take its turn), and every trigger is published exactly once.
#[tokio::test]
async fn a_scan_past_its_budget_leaves_the_rest_to_the_next_which_starts_there() {
    let s = World::new().await;
    let mut watchers = Vec::new();
    for item in ["SKU-1", "SKU-2", "SKU-3", "SKU-4"] {
        watchers.push(
            s.watcher(item, Trigger::PriceBelow { threshold: 1200 }, 1100)
                .await,
        );
    }
    let late = s
        .watcher("SKU-0", Trigger::PriceBelow { threshold: 1200 }, 1500)
        .await;
    let d = detector(&s, 0, 1);
    let t = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();
    let s = &s;
    let published = |n: usize| async move {
        let all = s.enqueued().await;
        assert_eq!(all.len(), n);
        all.into_iter().map(|r| r.watch_id).collect::<Vec<_>>()
    };

    let first = d
        .scan_within(t, Some(1), Duration::ZERO, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!((first.holding, first.published, first.deferred), (4, 1, 3));
    assert_eq!(published(1).await, vec![watchers[0].watch]);

    // SKU-0 comes before SKU-2 in item order, but the next scan starts where this one stopped.
    s.catalog.set_price("SKU-0", 1000);
    let second = d
        .scan_within(
            t + ChronoDuration::seconds(1),
            Some(2),
            Duration::ZERO,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!((second.published, second.deferred), (2, 2));
    assert_eq!(
        published(3).await[1..],
        [watchers[1].watch, watchers[2].watch]
    );

    let third = d
        .scan_within(
            t + ChronoDuration::seconds(2),
            None,
            Duration::ZERO,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!((third.published, third.deferred), (2, 0));
    let mut all = published(5).await;
    all.sort();
    let mut expected: Vec<_> = watchers.iter().map(|w| w.watch).collect();
    expected.push(late.watch);
    expected.sort();
    assert_eq!(all, expected, "each watch once");
    let fourth = d
        .scan_within(
            t + ChronoDuration::seconds(3),
            Some(10),
            Duration::ZERO,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!((fourth.evaluated, fourth.published), (0, 0), "all settled");
    s.cleanup().await;
}

#[tokio::test]
async fn hinted_items_are_fetched_at_their_source_s_rate_and_unwatched_ones_let_go() {
    let s = World::new().await;
    let below = Trigger::PriceBelow { threshold: 1200 };
    for item in ["H1", "H2", "H3", "H4"] {
        s.watcher(item, below.clone(), 1100).await;
    }
    let mut source = s.catalog.source_config(false);
    source.sources[0].hints.rate = 2;
    let settings = Settings::new(s.subjects.clone(), source.clone());
    let d = Detector::new(
        s.db.pool.clone(),
        s.js.clone(),
        Sources::new(source.clone()).unwrap(),
        settings,
    );
    let mut queues = tidings_detector::hints::Queues::new(&source);
    queues.add(
        "default",
        br#"{"items": ["H1", "H2", "H3", "H4", "NOBODY", "H1"]}"#,
    );
    queues.add("default", b"not a hint");
    queues.add("elsewhere", br#"{"items": ["H1"]}"#);
    // Two a second: the first two now, nothing more this second, the other two the next.
    let first = queues.due(&d).await;
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(queues.due(&d).await.is_empty());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = queues.due(&d).await;
    assert_eq!(second.len(), 2, "{second:?}");
    let mut all: Vec<String> = first.iter().chain(&second).map(|c| c.to_string()).collect();
    all.sort();
    assert_eq!(
        all,
        ["H1", "H2", "H3", "H4"],
        "each once; NOBODY is watched by none"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(queues.due(&d).await.is_empty(), "nothing left");

    let stats = d.scan_items(Utc::now(), first).await.unwrap();
    assert_eq!((stats.items, stats.published), (2, 2));
    assert_eq!(
        s.catalog.requests(),
        (2, 0),
        "only the hinted items were fetched"
    );
    s.cleanup().await;
}

/// A detector reading one watch a page, whose items each hold a watch that holds.
async fn paged(s: &World, items: &[&str]) -> (Detector, Vec<tidings_domain::WatchId>) {
    let mut watches = Vec::new();
    for item in items {
        let below = Trigger::PriceBelow { threshold: 1200 };
        watches.push(s.watcher(item, below, 1100).await.watch);
    }
    let mut settings = Settings::new(s.subjects.clone(), s.catalog.source_config(false));
    settings.page_size = 1;
    let source = Sources::new(settings.source.clone()).unwrap();
    let d = Detector::new(s.db.pool.clone(), s.js.clone(), source, settings);
    (d, watches)
}

/// A scan's pages start evenly over its spread, each found as it is read: what a scan finds
/// reaches the pipeline over the spread, not as one burst. A change hint does not wait for a
/// spread scan: the watchlist is free between pages.
#[tokio::test]
async fn a_scan_spreads_its_pages_and_lets_a_hint_through_between_them() {
    let s = World::new().await;
    let (d, watches) = paged(&s, &["P0", "P1", "P2", "P3", "HINTED"]).await;
    let hinted_watch = watches[4];
    // Five pages over 4 s: one every 800 ms, the last at 3.2 s.
    let spread = Duration::from_secs(4);
    let started = std::time::Instant::now();
    let stop = CancellationToken::new();
    let scan = d.scan_within(Utc::now(), None, spread, &stop);
    let hint = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let code = tidings_domain::ItemCode::parse("HINTED").unwrap();
        let stats = d.scan_items(Utc::now(), vec![code]).await.unwrap();
        (stats.published, started.elapsed())
    };
    let (scan, (hinted, hint_done)) = tokio::join!(scan, hint);
    let scan = scan.unwrap();
    let took = started.elapsed();
    assert_eq!(scan.items, 5);
    assert_eq!(scan.published + hinted, 5, "every watch once");
    assert!(
        hint_done < Duration::from_millis(2000),
        "the hint ran while the scan waited, not after it: done at {hint_done:?}"
    );
    assert!(took >= Duration::from_millis(3200), "{took:?}");
    assert!(
        scan.waited >= Duration::from_millis(1500) && scan.waited < took,
        "waited {:?} of {took:?}",
        scan.waited
    );
    let mut detected: Vec<_> = s
        .enqueued()
        .await
        .iter()
        .filter(|r| r.watch_id != hinted_watch)
        .map(|r| r.detected_at)
        .collect();
    detected.sort();
    let steps: Vec<i64> = detected
        .windows(2)
        .map(|w| (w[1] - w[0]).num_milliseconds())
        .collect();
    assert!(
        detected.len() >= 3
            && steps.iter().all(|ms| *ms >= 200)
            && steps.iter().sum::<i64>() >= 1500,
        "pages about 800 ms apart: {steps:?}"
    );
    s.cleanup().await;
}

/// A scan of `d` with a 30 s spread and `budget`, told to stop 300 ms in; how long it took.
async fn stopped_scan(
    d: &Detector,
    budget: Option<usize>,
) -> (tidings_detector::scan::ScanStats, Duration) {
    let stop = CancellationToken::new();
    let started = std::time::Instant::now();
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.cancel();
    };
    let (scan, ()) = tokio::join!(
        d.scan_within(Utc::now(), budget, Duration::from_secs(30), &stop),
        cancel
    );
    (scan.unwrap(), started.elapsed())
}

/// Shutting down does not wait for a spread scan's later pages: the scan returns at once, the
/// pages left to the next.
#[tokio::test]
async fn a_spread_scan_stops_waiting_when_told_to() {
    let s = World::new().await;
    let (d, _) = paged(&s, &["S0", "S1", "S2"]).await;
    let (scan, took) = stopped_scan(&d, None).await;
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!((scan.items, scan.published), (1, 1), "only the first page");
    let next = d.scan_once(Utc::now()).await.unwrap();
    assert_eq!(next.published, 2, "the next scan takes the rest");
    s.cleanup().await;
}

/// A stop after a spent budget keeps the budget's item as where the next scan starts: the
/// trigger it deferred goes first, not the stopped page's.
#[tokio::test]
async fn a_stop_after_a_spent_budget_resumes_at_the_deferred_trigger() {
    let s = World::new().await;
    // A0 has two watches, so it fills a page of its own; A1 is the page after.
    let (d, watches) = paged(&s, &["A0", "A0", "A1"]).await;
    let (first, _) = stopped_scan(&d, Some(1)).await;
    assert_eq!((first.published, first.deferred), (1, 1));
    let second = d
        .scan_within(
            Utc::now(),
            Some(1),
            Duration::ZERO,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(second.published, 1);
    let published: Vec<_> = s.enqueued().await.iter().map(|r| r.watch_id).collect();
    assert_eq!(published.len(), 2);
    assert!(
        published.iter().all(|w| watches[..2].contains(w)),
        "both of A0's, none of A1's: {published:?}"
    );
    s.cleanup().await;
}
