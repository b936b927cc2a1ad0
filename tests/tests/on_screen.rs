//! True on the screen, through the real services: a notification carries when its value was
//! observed and until when it may be shown as current, the push service may hold it no longer
//! than that, its `Topic` and `tag` name the watch and trigger, and a push that could not go out
//! in time is withheld with a reason of its own.

use serde_json::{Value, json};
use std::time::Duration;
use tidings_domain::messages::Subscription;
use tidings_domain::outbox::{DropReason, Reason, Status};
use tidings_domain::trigger::Trigger;
use tidings_domain::validity;
use tidings_tests::fake_catalog::Behavior;
use tidings_tests::fake_push::FakePushService;
use tidings_tests::scenario::Scenario;
use tidings_tests::services::Pipeline;

const BELOW_1200: Trigger = Trigger::PriceBelow { threshold: 1200 };

/// A story's world, a fake push service and one subscription of it.
async fn world() -> (Scenario, FakePushService, Subscription) {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let sub = push.subscription();
    (s, push, sub)
}

/// [`world`] with SKU-1 at 1500 (above every watch's threshold here) and the pipeline started
/// with `env`.
async fn started(env: &[(&str, &str)]) -> (Scenario, FakePushService, Subscription, Pipeline) {
    let (s, push, sub) = world().await;
    s.catalog.set_price("SKU-1", 1500);
    let p = Pipeline::start(&s, env).await;
    (s, push, sub, p)
}

#[tokio::test]
async fn a_push_carries_its_validity_as_ttl_and_names_its_watch_in_topic_and_tag() {
    let (s, push, sub) = world().await;
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
    let (s, push, sub) = world().await;
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

/// A device registered through the api, watching SKU-1 below 12.00 (at 15.00) with withdrawals
/// on or off, and the token.
async fn api_watcher(
    p: &Pipeline,
    sub: &Subscription,
    withdraw: bool,
) -> (reqwest::Client, String) {
    let http = reqwest::Client::new();
    let subscription =
        json!({"endpoint": sub.endpoint, "keys": {"p256dh": sub.p256dh, "auth": sub.auth}});
    let created = json_of(
        http.post(format!("{}/v1/devices", p.url("api")))
            .json(&json!({"subscription": subscription, "time_zone": "Europe/Berlin"})),
    )
    .await;
    let token = created["token"].as_str().unwrap().to_owned();
    let r = http
        .post(format!("{}/v1/watches", p.url("api")))
        .bearer_auth(&token)
        .json(&json!({
            "item_code": "SKU-1",
            "triggers": [{"kind": "price_below", "threshold": 1200}],
            "withdraw": withdraw,
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    (http, token)
}

#[tokio::test]
async fn a_device_asks_whether_its_notification_still_holds_and_reports_what_it_showed() {
    let (s, push, sub, p) = started(&[("TIDINGS_API_CHECK_CACHE", "0s")]).await;
    // Withdrawals off: the price moves back up below, and this test is about what the device
    // is told when it asks.
    let (http, token) = api_watcher(&p, &sub, false).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.catalog.set_price("SKU-1", 1000);
    p.wait_for_rows(&s, &[Status::Sent], 1, 60).await;
    let payload = push.received()[0].json();
    let id = payload["id"].as_str().unwrap().to_owned();
    let now = |token: String| {
        let (http, url) = (
            http.clone(),
            format!("{}/v1/notifications/{id}/now", p.url("api")),
        );
        async move { http.get(url).bearer_auth(token).send().await.unwrap() }
    };
    let answer = |token: String| {
        let now = now(token);
        async move {
            let r = now.await;
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    };

    let a = answer(token.clone()).await;
    assert_eq!(
        (a["holds"].as_bool(), a["shown"].as_str()),
        (Some(true), Some("as_sent"))
    );
    assert_eq!(a["body"], payload["body"]);
    s.catalog.set_price("SKU-1", 950);
    let a = answer(token.clone()).await;
    assert_eq!(a["shown"], "updated");
    assert_eq!(a["body"], "Now 9.50 EUR (your limit: 12.00 EUR).");
    s.catalog.set_price("SKU-1", 1500);
    let a = answer(token.clone()).await;
    assert_eq!(
        (a["holds"].as_bool(), a["shown"].as_str()),
        (Some(false), Some("corrected"))
    );
    let observed: chrono::DateTime<chrono::Utc> =
        payload["observed_at"].as_str().unwrap().parse().unwrap();
    let at = tidings_domain::shown::local_time(observed, chrono_tz::Europe::Berlin);
    assert_eq!(a["body"], format!("Was 10.00 EUR at {at}, now 15.00 EUR."));
    s.catalog.set_in_stock("SKU-1", false);
    assert_eq!(
        answer(token.clone()).await["body"],
        format!("Was 10.00 EUR at {at}, now sold out.")
    );
    // The catalog failing: no answer to show, so the device shows the payload "as of".
    s.catalog.set_behavior("SKU-1", Behavior::ServerError);
    assert_eq!(now(token.clone()).await.status(), 503);
    // Another device cannot read it.
    let (_, other) = api_watcher(&p, &push.subscription(), false).await;
    assert_eq!(now(other.clone()).await.status(), 404);

    // What the device showed goes into its history.
    let report = |token: &str, body: Value| {
        http.post(format!("{}/v1/notifications/{id}/shown", p.url("api")))
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    assert_eq!(
        report(&other, json!({"shown": "corrected"}))
            .await
            .unwrap()
            .status(),
        404
    );
    let bad = report(&token, json!({"shown": "maybe"}))
        .await
        .unwrap()
        .status();
    assert!(bad.is_client_error(), "{bad}");
    assert_eq!(
        report(&token, json!({"shown": "corrected"}))
            .await
            .unwrap()
            .status(),
        204
    );
    let items = history(&http, &p, &token).await;
    assert_eq!(items[0]["id"], id.as_str());
    assert_eq!(items[0]["shown"]["shown"], "corrected", "{items:?}");
    p.stop().await;
    s.cleanup().await;
}

/// The JSON body `request` is answered with.
async fn json_of(request: reqwest::RequestBuilder) -> Value {
    let answer = request.send().await.unwrap();
    answer.json().await.unwrap()
}

/// The device's history, newest first.
async fn history(http: &reqwest::Client, p: &Pipeline, token: &str) -> Vec<Value> {
    let page = json_of(
        http.get(format!("{}/v1/notifications", p.url("api")))
            .bearer_auth(token),
    )
    .await;
    page["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_notification_that_stops_holding_while_current_is_withdrawn_once() {
    let (s, push, sub, p) = started(&[]).await;
    let quiet_sub = push.subscription();
    let (http, token) = api_watcher(&p, &sub, true).await;
    let (_, quiet) = api_watcher(&p, &quiet_sub, false).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.catalog.set_price("SKU-1", 1000);
    p.wait_for_rows(&s, &[Status::Sent], 2, 60).await;
    let first = push.received_by(&sub)[0].json();

    // Back at 15.00 within the price's 20 minutes: one follow-up, in the first one's place.
    s.catalog.set_price("SKU-1", 1500);
    p.wait_for_rows(&s, &[Status::Sent], 3, 60).await;
    let got = push.received_by(&sub);
    assert_eq!(got.len(), 2, "rejected: {:?}", push.rejected());
    let withdrawal = got[1].json();
    assert_eq!(withdrawal["withdraws"], first["id"]);
    assert_eq!(withdrawal["tag"], first["tag"], "it replaces the shown one");
    assert_eq!(got[1].topic, got[0].topic, "and the undelivered one");
    let observed: chrono::DateTime<chrono::Utc> =
        first["observed_at"].as_str().unwrap().parse().unwrap();
    let at = tidings_domain::shown::local_time(observed, chrono_tz::Europe::Berlin);
    assert_eq!(withdrawal["title"], "SKU-1 has changed");
    assert_eq!(
        withdrawal["body"],
        format!("Was 10.00 EUR at {at}, now 15.00 EUR.")
    );
    let items = history(&http, &p, &token).await;
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["id"], withdrawal["id"]);
    assert_eq!(items[0]["withdraws"], first["id"]);
    assert_eq!(items[0]["status"], "sent");
    assert_eq!(items[0]["trigger"]["kind"], "price_below");
    assert_eq!(items[0]["dedup_day"], items[1]["dedup_day"]);
    assert_eq!(items[1]["withdraws"], Value::Null);

    // The same drop again later that day: the day's alert was sent and withdrawn, so nothing
    // more (docs/design.md: one alert and one withdrawal per watch, trigger and day).
    s.catalog.set_price("SKU-1", 1000);
    tokio::time::sleep(Duration::from_secs(3)).await;
    s.catalog.set_price("SKU-1", 1500);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(push.received_by(&sub).len(), 2);
    assert_eq!(history(&http, &p, &token).await.len(), 2);
    // The watch that turned withdrawals off got its alert only.
    assert_eq!(push.received_by(&quiet_sub).len(), 1);
    assert_eq!(history(&http, &p, &quiet).await.len(), 1);
    p.stop().await;
    s.cleanup().await;
}

#[tokio::test]
async fn a_notification_whose_validity_ran_out_is_not_withdrawn() {
    let (s, push, sub, p) = started(&[("TIDINGS_VALIDITY_PRICE", "2s")]).await;
    api_watcher(&p, &sub, true).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.catalog.set_price("SKU-1", 1000);
    p.wait_for_rows(&s, &[Status::Sent], 1, 60).await;
    // Past valid_until a shown notification reads "as of" its time: nothing to withdraw.
    tokio::time::sleep(Duration::from_secs(3)).await;
    s.catalog.set_price("SKU-1", 1500);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(push.received().len(), 1, "no withdrawal");
    assert_eq!(s.db.count("SELECT count(*) FROM outbox").await, 1);
    p.stop().await;
    s.cleanup().await;
}

#[tokio::test]
async fn a_notification_still_waiting_for_its_device_is_deleted_instead_of_withdrawn() {
    let (s, push, sub, p) = started(&[]).await;
    let (http, token) = api_watcher(&p, &sub, true).await;
    push.set_offline(&sub, true);
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.catalog.set_price("SKU-1", 1000);
    p.wait_for_rows(&s, &[Status::Sent], 1, 60).await;
    assert_eq!(push.waiting().len(), 1, "accepted, waiting for the device");

    // Back up before the device came back: the push service deletes the stored message, and
    // the withdrawal is not sent.
    s.catalog.set_price("SKU-1", 1500);
    p.wait_for_rows(&s, &[Status::Dropped], 1, 60).await;
    assert_eq!(push.deleted().len(), 1);
    push.set_offline(&sub, false);
    assert!(push.received().is_empty(), "the device is shown nothing");
    let items = history(&http, &p, &token).await;
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["withdraws"], items[1]["id"]);
    assert_eq!(
        (&items[0]["status"], &items[0]["reason"]),
        (&json!("dropped"), &json!("recalled"))
    );
    assert_eq!(items[0]["delivery"], "withheld");
    assert_eq!(items[0]["attempts"][0]["outcome"], "recalled");
    p.stop().await;
    s.cleanup().await;
}
