//! True on the screen, through the real services: a notification carries when its value was
//! observed and until when it may be shown as current, the push service may hold it no longer
//! than that, its `Topic` and `tag` name the watch and trigger, and a push that could not go out
//! in time is withheld with a reason of its own.

use std::time::Duration;
use tidings_domain::outbox::{DropReason, Reason, Status};
use tidings_domain::trigger::Trigger;
use tidings_domain::validity;
use tidings_tests::fake_push::FakePushService;
use tidings_tests::scenario::Scenario;
use tidings_tests::services::Pipeline;

const BELOW_1200: Trigger = Trigger::PriceBelow { threshold: 1200 };

#[tokio::test]
async fn a_push_carries_its_validity_as_ttl_and_names_its_watch_in_topic_and_tag() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let sub = push.subscription();
    let w = s.watcher_at("SKU-1", BELOW_1200, 1500, &sub).await;
    let p = Pipeline::start(&s, &[("TIDINGS_VALIDITY_PRICE", "10m")]).await;
    s.catalog.set_price("SKU-1", 1000);
    p.wait_for_rows(&s, &[Status::Sent], 1, 60).await;

    let got = push.received_by(&sub);
    assert_eq!(got.len(), 1, "rejected: {:?}", push.rejected());
    let row = &s.rows(w.watch).await[0];
    let payload = got[0].json();
    assert_eq!(payload["id"], row.notification.id.to_string());
    assert_eq!(payload["tag"], validity::tag(w.watch, &BELOW_1200));
    assert_eq!(
        got[0].topic.as_deref(),
        Some(validity::topic(w.watch, &BELOW_1200).as_str())
    );
    let at = |key: &str| {
        chrono::DateTime::parse_from_rfc3339(payload[key].as_str().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{key} in {payload}: {e}"))
    };
    assert_eq!(
        at("valid_until") - at("observed_at"),
        chrono::Duration::minutes(10),
        "valid until the re-check plus the price validity"
    );
    assert_eq!(
        row.notification.sent_value.as_ref().unwrap()["observed_at"],
        payload["observed_at"],
        "observed when the re-check read it"
    );
    // What was left of the ten minutes when the push went out, never more.
    let ttl: u32 = got[0].ttl.as_deref().unwrap().parse().unwrap();
    assert!((590..=600).contains(&ttl), "TTL {ttl}");
    assert_eq!(got[0].urgency.as_deref(), Some("normal"));
    p.stop().await;
    s.cleanup().await;
}

#[tokio::test]
async fn a_push_that_waits_past_its_validity_is_withheld_with_its_reason() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let sub = push.subscription();
    let w = s.watcher_at("SKU-1", BELOW_1200, 1500, &sub).await;
    // No pusher yet: the request waits in the push stream while its one second runs out.
    let mut p = Pipeline::start_only(
        &s,
        &["detector", "dispatcher"],
        &[("TIDINGS_VALIDITY_PRICE", "1s")],
    )
    .await;
    s.catalog.set_price("SKU-1", 1000);
    p.wait_for_rows(&s, &[Status::Sending], 1, 60).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    p.spawn("pusher");
    p.wait_ready("pusher").await;
    p.wait_for_rows(&s, &[Status::Dropped], 1, 60).await;

    let row = &s.rows(w.watch).await[0];
    assert_eq!(
        row.notification.reason,
        Some(Reason::Dropped(DropReason::ValidityExpired))
    );
    assert!(!row.notification.maybe_delivered);
    assert!(
        row.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("validity ran out"),
        "{:?}",
        row.last_error
    );
    assert_eq!(push.hits(), 0, "nothing reached the push service");
    let baselines = s.db.count("SELECT count(*) FROM baselines").await;
    assert_eq!(baselines, 0, "a withheld row never moves the baseline");
    p.stop().await;
    s.cleanup().await;
}
