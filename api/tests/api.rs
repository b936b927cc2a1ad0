//! The api over HTTP against real Postgres: the client story, isolation between devices, every
//! validation rule, idempotent creates, and the OpenAPI document against the router.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

#[path = "support/openapi.rs"]
mod openapi;
#[path = "support/server.rs"]
mod server;

use chrono::Utc;
use openapi::{Document, Parameter};
use reqwest::{Method, Response};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use server::{ADMIN_TOKEN, ApiServer, VAPID_PUBLIC, browser_subscription, test_settings};
use std::collections::{BTreeMap, BTreeSet};
use tidings_api::Settings;
use tidings_api_types::clients::{ClientCreated, ClientList};
use tidings_api_types::devices::{DeviceCreated, MyDevice, SubscriptionReplaced, VapidPublicKey};
use tidings_api_types::doctor::Diagnosis;
use tidings_api_types::endpoints::{EndpointCreated, EndpointStatus, SecretRotated};
use tidings_api_types::objects::{DeviceView, Watch, WatchList, WatchView};
use tidings_api_types::outbox::{
    BulkReport, Cancelled, NotificationList, OutboxList, OutboxRow, OutboxStats, Replayed,
};
use tidings_api_types::problem::Problem;
use tidings_api_types::triggers::TriggerSpec;
use tidings_domain::Channel;
use tidings_domain::outbox::{Delivery, DropReason, Event, FailReason, Reason, Status};
use tidings_domain::subscription::Deactivation;
use tidings_domain::trigger::{Observation, Trigger};
use tidings_domain::{DeviceId, OutboxId, WatchId};
use tidings_endpoint_guard::EndpointPolicy;
use tidings_testkit::binaries::cli;
use tidings_testkit::fixtures::{self, Device, Inserted};
use tidings_testkit::harness::{TestDb, tool};
use tidings_testkit::walk::{self, Step, walk};
use uuid::Uuid;

/// The answer's body, decoded as the type the api answers with.
async fn answer<T: DeserializeOwned>(r: Response) -> T {
    r.json().await.expect("a body of the answer's type")
}

/// A price in a recorded value (`checked`, `sent`): all the tests read of it.
#[derive(Debug, Deserialize, PartialEq)]
struct Priced {
    price: i64,
}

fn price_in(value: Option<&Value>) -> i64 {
    let value = value.expect("a recorded value").clone();
    serde_json::from_value::<Priced>(value).unwrap().price
}

/// Asserts a problem+json answer with `status`; returns the problem.
async fn problem(r: Response, status: u16) -> Problem {
    assert_eq!(r.status().as_u16(), status, "unexpected status");
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let p: Problem = answer(r).await;
    assert_eq!(p.status, status);
    assert!(p.kind.starts_with("/problems/"), "{p:?}");
    assert!(!p.detail.is_empty(), "{p:?}");
    p
}

/// Whether the problem's detail, or one of its fields' details, says `words`.
fn tells(p: &Problem, words: &str) -> bool {
    p.detail.contains(words) || p.errors.iter().any(|e| e.detail.contains(words))
}

fn pointer(p: &Problem) -> &str {
    p.errors.first().map_or("", |e| e.pointer.as_str())
}

fn below(threshold: i64) -> Value {
    json!({"kind": "price_below", "threshold": threshold})
}

/// An outbox row for a watch made through the api, as ingest would insert it.
async fn outbox_row(db: &sqlx::PgPool, device: &str, watch: &str, price: i64) -> Uuid {
    let device = Device {
        id: DeviceId(device.parse().unwrap()),
        time_zone: "Europe/Berlin".into(),
    };
    let req = fixtures::enqueue_request(
        &device,
        WatchId(watch.parse().unwrap()),
        Trigger::PriceBelow { threshold: 1200 },
        price,
        Utc::now(),
    );
    match fixtures::insert_outbox(db, &req).await.unwrap() {
        Inserted::New(id) => id.0,
        Inserted::Duplicate => panic!("duplicate"),
    }
}

/// Creates a watch for `item` with `triggers`; returns the watch as the api answered it.
async fn create_watch(api: &ApiServer, token: &str, item: &str, triggers: Value) -> Watch {
    let body = json!({"item_code": item, "triggers": triggers});
    let r = api
        .send(Method::POST, "/v1/watches", Some(token), &body)
        .await;
    assert_eq!(r.status(), 201, "create {item}");
    answer(r).await
}

/// `POST /v1/admin/outbox/{id}/replay` as the operator.
async fn replay_row(api: &ApiServer, id: impl std::fmt::Display) -> Response {
    let path = format!("/v1/admin/outbox/{id}/replay");
    api.call(Method::POST, &path, Some(ADMIN_TOKEN)).await
}

/// The re-check found the condition no longer holds: the row is withheld.
fn condition_lost() -> Event {
    Event::Withheld(DropReason::ConditionLost)
}

/// Row `id` as the store reads it, with its delivery record.
async fn stored(db: &sqlx::PgPool, id: Uuid) -> tidings_store::history::Delivery {
    tidings_store::history::delivery(db, OutboxId(id))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no outbox row {id}"))
}

#[tokio::test]
async fn history_says_may_have_been_delivered_when_an_attempt_timed_out_before_a_drop() {
    let db = TestDb::new().await.unwrap();
    let api = ApiServer::start(db.pool.clone(), test_settings()).await;
    let (device, token) = api.register().await;
    let mut watches = Vec::new();
    for item in ["SKU-1", "SKU-2", "SKU-3"] {
        let w = create_watch(&api, &token, item, json!([below(1200)])).await;
        watches.push(w.id.to_string());
    }
    let db = &db.pool;
    let lost = condition_lost();
    let row = OutboxId;

    // Withheld outright: the price went back up before the first attempt.
    let withheld = outbox_row(db, &device, &watches[0], 1100).await;
    walk(db, row(withheld), &[lost]).await;
    // Attempt 1 timed out after it was sent, then the retry's re-check found the price back up.
    let maybe = outbox_row(db, &device, &watches[1], 1050).await;
    walk(db, row(maybe), &[Event::Dispatched, Event::Unknown, lost]).await;
    // Still retrying after such a timeout.
    let open = outbox_row(db, &device, &watches[2], 1000).await;
    let t = walk(db, row(open), &[Event::Dispatched, Event::Unknown]).await;
    assert!(t.maybe_delivered && t.retry_count == 1, "{t:?}");

    let history: NotificationList = answer(api.get("/v1/notifications", Some(&token)).await).await;
    let delivery = |id: Uuid| {
        let n = history.items.iter().find(|n| n.id == id).unwrap();
        (n.status, n.delivery)
    };
    assert_eq!(delivery(withheld), (Status::Dropped, Delivery::Withheld));
    assert_eq!(
        delivery(maybe),
        (Status::Dropped, Delivery::MayHaveBeenDelivered)
    );
    assert_eq!(delivery(open), (Status::Retry, Delivery::InProgress));

    // The mark is evidence: the database refuses to clear it (raw SQL on purpose: the state no
    // code makes).
    let cleared = sqlx::query("UPDATE outbox SET maybe_delivered = false WHERE id = $1")
        .bind(open)
        .execute(db)
        .await;
    assert!(cleared.is_err(), "maybe_delivered was cleared");
    api.stop().await;
}

#[tokio::test]
async fn a_client_registers_watches_pauses_reads_history_and_leaves() {
    let db = TestDb::new().await.unwrap();
    let api = ApiServer::start(db.pool.clone(), test_settings()).await;

    let key: VapidPublicKey = answer(api.get("/v1/vapid-public-key", None).await).await;
    assert_eq!(key.public_key, VAPID_PUBLIC);

    let (device, token) = api.register().await;
    assert_eq!(token.len(), 43, "32 random bytes, base64url");
    let stored: Vec<u8> = sqlx::query_scalar("SELECT token_hash FROM devices WHERE id = $1::uuid")
        .bind(&device)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_ne!(stored, token.as_bytes(), "only the hash is stored");

    let mut ids = Vec::new();
    for (item, trigger) in [
        ("SKU-1", json!({"kind": "price_below", "threshold": 1200})),
        ("SKU-2", json!({"kind": "price_drop", "percent": 10})),
    ] {
        let r = api
            .send(
                Method::POST,
                "/v1/watches",
                Some(&token),
                &json!({"item_code": item, "triggers": [trigger, {"kind": "back_in_stock"}]}),
            )
            .await;
        assert_eq!(r.status(), 201);
        let w: Watch = answer(r).await;
        assert_eq!(w.item_code, item);
        assert_eq!(w.channel, Channel::WebPush);
        assert_eq!(w.triggers.len(), 2);
        ids.push(w.id.to_string());
    }

    // Paged listing, oldest first.
    let page1: WatchList = answer(api.get("/v1/watches?limit=1", Some(&token)).await).await;
    assert_eq!(page1.items[0].id.to_string(), ids[0]);
    let next = page1.next_cursor.unwrap();
    let page2: WatchList = answer(
        api.get(&format!("/v1/watches?limit=1&cursor={next}"), Some(&token))
            .await,
    )
    .await;
    assert_eq!(page2.items[0].id.to_string(), ids[1]);
    assert!(page2.next_cursor.is_none());

    let paused: Watch = answer(
        api.send(
            Method::PATCH,
            &format!("/v1/watches/{}", ids[1]),
            Some(&token),
            &json!({"paused": true}),
        )
        .await,
    )
    .await;
    assert!(paused.paused);
    let read: Watch = answer(
        api.get(&format!("/v1/watches/{}", ids[1]), Some(&token))
            .await,
    )
    .await;
    assert!(read.paused);

    // History: a withheld row and a pending one, newest first, with the reason.
    let withheld = outbox_row(&db.pool, &device, &ids[0], 1100).await;
    let lost = Step::from(condition_lost()).checked(Observation {
        price: 1300,
        currency: "EUR".into(),
        in_stock: true,
        paused: false,
        observed_at: Utc::now(),
        stock_stated: true,
    });
    walk(&db.pool, OutboxId(withheld), [lost]).await;
    let pending = outbox_row(&db.pool, &device, &ids[1], 1000).await;
    let history: NotificationList = answer(api.get("/v1/notifications", Some(&token)).await).await;
    let items = &history.items;
    assert_eq!(items.len(), 2);
    assert_eq!((items[0].id, items[0].status), (pending, Status::Pending));
    assert_eq!(items[1].status, Status::Dropped);
    assert_eq!(
        items[1].reason,
        Some(Reason::Dropped(DropReason::ConditionLost))
    );
    assert_eq!(items[1].detected.price, 1100);
    assert_eq!(price_in(items[1].checked.as_ref()), 1300);
    assert_eq!(items[1].item_code.as_deref(), Some("SKU-1"));
    assert_eq!(
        items[1].trigger,
        TriggerSpec::PriceBelow { threshold: 1200 }
    );
    // How far back history reaches: the oldest week the outbox holds.
    let oldest: chrono::NaiveDate = sqlx::query_scalar(
        "SELECT min(to_date(substr(c.relname, 8), 'YYYYMMDD')) FROM pg_inherits i
         JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'outbox'::regclass",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(history.kept_from, Some(oldest));
    let dropped_only: NotificationList = answer(
        api.get("/v1/notifications?status=dropped", Some(&token))
            .await,
    )
    .await;
    assert_eq!(dropped_only.items.len(), 1);

    // Leaving: the token stops working, watches and subscription go.
    let r = api
        .call(Method::DELETE, "/v1/devices/me", Some(&token))
        .await;
    assert_eq!(r.status(), 204);
    problem(api.get("/v1/watches", Some(&token)).await, 401).await;
    db.assert_count("SELECT count(*) FROM watches WHERE removed_at IS NULL", 0)
        .await;
    db.assert_count("SELECT count(*) FROM push_subscriptions WHERE active", 0)
        .await;
    // Its pending row stays as it is: the dispatcher's pre-guard drops it as `watch_removed`
    // (the dispatcher's tests: pre_guards_drop_paused_and_removed_watches_…).
    let (_, status) =
        tidings_store::history::status_of(&db.pool, tidings_domain::OutboxId(pending))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(status, tidings_domain::outbox::Status::Pending);

    api.stop().await;
}

#[tokio::test]
async fn replacing_the_subscription_keeps_exactly_one_active() {
    let (db, api) = ApiServer::on_fresh_db().await;
    let (device, token) = api.register().await;
    let r = api
        .send(
            Method::PUT,
            "/v1/devices/me/subscription",
            Some(&token),
            &browser_subscription("https://127.0.0.1:9/push/new"),
        )
        .await;
    assert_eq!(r.status(), 200);
    let new = answer::<SubscriptionReplaced>(r).await.subscription_id;
    let active: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT id, endpoint FROM push_subscriptions WHERE device_id = $1::uuid AND active",
    )
    .bind(&device)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        active,
        vec![(new, "https://127.0.0.1:9/push/new".to_owned())]
    );
    db.assert_count(
        "SELECT count(*) FROM push_subscriptions WHERE deactivation_reason = 'replaced'",
        1,
    )
    .await;
    api.stop().await;
}

#[tokio::test]
async fn another_devices_watch_answers_404_and_is_not_touched() {
    let (db, api) = ApiServer::on_fresh_db().await;
    let (device_a, a) = api.register().await;
    let (_, b) = api.register().await;
    let w = create_watch(&api, &a, "SKU-1", json!([{"kind": "back_in_stock"}])).await;
    let id = w.id.to_string();
    let path = format!("/v1/watches/{id}");
    outbox_row(&db.pool, &device_a, &id, 1000).await;

    problem(api.get(&path, Some(&b)).await, 404).await;
    problem(
        api.send(Method::PATCH, &path, Some(&b), &json!({"paused": true}))
            .await,
        404,
    )
    .await;
    problem(api.call(Method::DELETE, &path, Some(&b)).await, 404).await;
    // A malformed id is the same answer as someone else's.
    problem(api.get("/v1/watches/not-a-uuid", Some(&b)).await, 404).await;
    let b_list: WatchList = answer(api.get("/v1/watches", Some(&b)).await).await;
    assert!(b_list.items.is_empty());
    let b_history: NotificationList = answer(api.get("/v1/notifications", Some(&b)).await).await;
    assert!(b_history.items.is_empty());

    let still: Watch = answer(api.get(&path, Some(&a)).await).await;
    assert!(!still.paused);
    assert_eq!(still.updated_at, w.updated_at);
    db.assert_count(
        "SELECT count(*) FROM watches WHERE removed_at IS NULL AND NOT paused",
        1,
    )
    .await;
    api.stop().await;
}

#[tokio::test]
async fn preferences_are_set_at_creation_changed_by_patch_and_shown_in_every_view() {
    let (db, api) = ApiServer::on_fresh_db().await;
    let night = json!({"quiet_hours": {"start": "22:00", "end": "07:30", "days": ["sat", "sun"]},
                       "cap": {"max": 5, "window_seconds": 86400}});
    let r = api
        .send(
            Method::POST,
            "/v1/devices",
            None,
            &json!({
                "subscription": browser_subscription("https://127.0.0.1:9/push/p"),
                "time_zone": "Asia/Tokyo",
                "preferences": night,
            }),
        )
        .await;
    let created: DeviceCreated = answer(r).await;
    assert_eq!(serde_json::to_value(&created.preferences).unwrap(), night);
    let token = created.token;
    let me: MyDevice = answer(api.get("/v1/devices/me", Some(&token)).await).await;
    assert_eq!((me.time_zone.as_str(), me.locale), ("Asia/Tokyo", None));
    assert_eq!(serde_json::to_value(&me.preferences).unwrap(), night);

    // A PATCH changes what it names and nothing else; null locale reads English again.
    let daily = json!({"quiet_hours": {"start": "23:00:30", "end": "06:00"},
                       "digest": "weekly on mon at 08:00"});
    let patch = |body: Value| {
        let (api, token) = (&api, &token);
        async move {
            api.send(Method::PATCH, "/v1/devices/me", Some(token), &body)
                .await
        }
    };
    let me: MyDevice = answer(patch(json!({"locale": "ja-JP"})).await).await;
    assert_eq!(me.locale.as_deref(), Some("ja-JP"));
    assert_eq!(serde_json::to_value(&me.preferences).unwrap(), night);
    let me: MyDevice = answer(patch(json!({"preferences": daily, "locale": null})).await).await;
    assert_eq!(
        (me.locale, serde_json::to_value(&me.preferences).unwrap()),
        (None, daily.clone())
    );
    // Wrong preferences name their field, and change nothing.
    for (body, at) in [
        (
            json!({"preferences": {"quiet_hours": {"start": "22:00", "end": "22:00"}}}),
            "/preferences/quiet_hours/end",
        ),
        (
            json!({"preferences": {"cap": {"max": 0, "window_seconds": 60}}}),
            "/preferences/cap/max",
        ),
        (
            json!({"preferences": {"quiet_hours": {"start": "8:00", "end": "09:00"}}}),
            "/preferences/quiet_hours/start",
        ),
        (
            json!({"preferences": {"digest": "daily at 8:00"}}),
            "/preferences/digest",
        ),
        (
            json!({"preferences": {"digest": "monthly"}}),
            "/preferences/digest",
        ),
        (json!({"preferences": [{"cap": null}]}), "/preferences"),
        (json!({"preferences": null}), "/preferences"),
        (json!({"locale": "not a tag"}), "/locale"),
    ] {
        let p = problem(patch(body.clone()).await, 422).await;
        assert!(pointer(&p).starts_with(at), "{body}: {p:?}");
    }
    let me: MyDevice = answer(api.get("/v1/devices/me", Some(&token)).await).await;
    assert_eq!(serde_json::to_value(&me.preferences).unwrap(), daily);
    // Changed preferences make held rows due at once, to be judged by them; a locale does not.
    let device_id = created.device_id.to_string();
    let held = outbox_row(&db.pool, &device_id, &Uuid::new_v4().to_string(), 1000).await;
    sqlx::query(
        "UPDATE outbox SET held = 'quiet_hours', next_attempt_at = now() + interval '8 hours'
         WHERE id = $1",
    )
    .bind(held)
    .execute(&db.pool)
    .await
    .unwrap();
    let due_now = "SELECT count(*) FROM outbox WHERE held IS NOT NULL AND next_attempt_at <= now()";
    let _: MyDevice = answer(patch(json!({"locale": "en"})).await).await;
    db.assert_count(due_now, 0).await;
    let _: MyDevice = answer(patch(json!({"preferences": daily})).await).await;
    db.assert_count(due_now, 1).await;

    // A watch takes its own preferences and urgency at creation, by either create path.
    let own = json!({"cap": {"max": 1, "window_seconds": 60}});
    let body = json!({"item_code": "SKU-P", "triggers": [{"kind": "back_in_stock"}],
                      "urgent": true, "preferences": own});
    let queued: Watch = answer(
        api.send(Method::POST, "/v1/watches", Some(&token), &body)
            .await,
    )
    .await;
    let keyed: Watch = answer(
        api.req(Method::POST, "/v1/watches", Some(&token))
            .header("idempotency-key", "prefs-1")
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    for w in [&queued, &keyed] {
        assert!(w.urgent);
        assert_eq!(serde_json::to_value(&w.preferences).unwrap(), own);
        let path = format!("/v1/watches/{}", w.id);
        let shown: Watch = answer(api.get(&path, Some(&token)).await).await;
        assert_eq!(
            (shown.urgent, shown.preferences.clone()),
            (true, w.preferences.clone())
        );
    }
    let path = format!("/v1/watches/{}", queued.id);
    let patch = |body: Value| {
        let (api, token, path) = (&api, &token, &path);
        async move { api.send(Method::PATCH, path, Some(token), &body).await }
    };
    let held = outbox_row(&db.pool, &device_id, &queued.id.to_string(), 1000).await;
    sqlx::query(
        "UPDATE outbox SET held = 'cap', next_attempt_at = now() + interval '1 hour' WHERE id = $1",
    )
    .bind(held)
    .execute(&db.pool)
    .await
    .unwrap();
    let w: Watch = answer(patch(json!({"withdraw": false, "urgent": false})).await).await;
    db.assert_count(due_now, 2).await;
    assert_eq!((w.withdraw, w.urgent, w.paused), (false, false, false));
    assert!(w.preferences.is_some(), "left out: unchanged");
    // A body is an object, not an array of the fields in order.
    for array in [json!([null, null]), json!([true, false, true])] {
        let p = problem(patch(array.clone()).await, 422).await;
        assert!(
            p.detail.contains("expected a JSON object"),
            "{array}: {p:?}"
        );
    }
    let w: Watch = answer(patch(json!({"preferences": null, "paused": true})).await).await;
    assert_eq!((w.preferences, w.paused, w.withdraw), (None, true, false));
    let p = problem(
        patch(json!({"preferences": {"cap": {"max": 5, "window_seconds": 0}}})).await,
        422,
    )
    .await;
    assert_eq!(pointer(&p), "/preferences/cap/window_seconds");
    db.assert_count(
        "SELECT count(*) FROM watches WHERE preferences IS NULL AND paused AND NOT withdraw
                                          AND NOT urgent",
        1,
    )
    .await;
    // The operator's view shows the device's.
    let view: DeviceView = answer(
        api.get(
            &format!("/v1/admin/devices/{}", created.device_id),
            Some(ADMIN_TOKEN),
        )
        .await,
    )
    .await;
    assert_eq!(serde_json::to_value(&view.preferences).unwrap(), daily);
    api.stop().await;
}

#[tokio::test]
async fn missing_or_invalid_tokens_get_401() {
    let (_db, api) = ApiServer::on_fresh_db().await;
    let (_, token) = api.register().await;
    // The real token with its last character changed (to one it is not: a fixed "A" matched one
    // token in 64, and that run got 200).
    let last = if token.ends_with('A') { 'B' } else { 'A' };
    let wrong = format!("{}{last}", &token[..token.len() - 1]);
    assert_ne!(wrong, token);
    for t in [None, Some("garbage"), Some(wrong.as_str())] {
        let p = problem(api.get("/v1/watches", t).await, 401).await;
        assert_eq!(p.kind, "/problems/unauthorized");
    }
    // A device token is not an operator token, and vice versa.
    problem(api.get("/v1/admin/outbox", Some(&token)).await, 401).await;
    problem(api.get("/v1/watches", Some(ADMIN_TOKEN)).await, 401).await;
    api.stop().await;
}

#[tokio::test]
async fn every_registration_rule_refuses_bad_input_with_a_problem() {
    let db = TestDb::new().await.unwrap();
    let mut strict = test_settings();
    // Allowlisted by name but private: the address rule must still refuse it.
    strict.policy = EndpointPolicy {
        allowed_hosts: vec!["127.0.0.1:*".into(), "fcm.googleapis.com".into()],
        private_hosts: Vec::new(),
        allow_http: false,
    };
    let api = ApiServer::start(db.pool.clone(), strict).await;
    let good = browser_subscription("https://127.0.0.1:9/push/x");
    let with = |path: &str, value: Value| {
        let mut sub = good.clone();
        *sub.pointer_mut(path).unwrap() = value;
        json!({"subscription": sub})
    };
    let mut bad_point = vec![4u8];
    bad_point.extend([1u8; 64]);
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let cases = [
        (
            with("/keys/p256dh", json!(b64(&bad_point))),
            "/subscription/keys/p256dh",
            "curve",
        ),
        (
            with("/keys/p256dh", json!(b64(&[4u8; 33]))),
            "/subscription/keys/p256dh",
            "65 bytes",
        ),
        (
            with("/keys/p256dh", json!("not base64!")),
            "/subscription/keys/p256dh",
            "base64url",
        ),
        (
            with("/keys/auth", json!(b64(&[7u8; 15]))),
            "/subscription/keys/auth",
            "16 bytes",
        ),
        (
            with(
                "/endpoint",
                json!(format!("https://fcm.googleapis.com/{}", "a".repeat(2100))),
            ),
            "/subscription/endpoint",
            "longer",
        ),
        (
            json!({"subscription": good, "time_zone": "Mars/Olympus"}),
            "/time_zone",
            "Mars/Olympus",
        ),
        (
            json!({"subscription": good, "locale": "ja_JP"}),
            "/locale",
            "BCP 47",
        ),
        (
            json!({"subscription": good, "locale": "x".repeat(36)}),
            "/locale",
            "BCP 47",
        ),
    ];
    // The endpoint guard's refusals (credentials would be forwarded as Basic auth beside VAPID,
    // and the push service's 401 blamed on the key).
    let endpoints = [
        ("http://fcm.googleapis.com/fcm/send/x", "https"),
        ("https://evil.example.com/push", "not an allowed"),
        ("https://127.0.0.1:9/push/x", "private"),
        (
            "https://user:secretpw@fcm.googleapis.com/x",
            "user name or password",
        ),
        ("https://fcm.googleapis.com/x#frag", "fragment"),
        ("https://fcm.googleapis.com:0/x", "port 0"),
        ("https://fcm.googleapis.com:1/x", "port 1"),
    ]
    .map(|(endpoint, says)| {
        (
            with("/endpoint", json!(endpoint)),
            "/subscription/endpoint",
            says,
        )
    });
    for (body, at, says) in cases.into_iter().chain(endpoints) {
        let p = problem(
            api.send(Method::POST, "/v1/devices", None, &body).await,
            422,
        )
        .await;
        assert_eq!(pointer(&p), at, "{p:?}");
        assert!(p.detail.contains(says), "{p:?} should say {says}");
    }
    assert_eq!(db.count("SELECT count(*) FROM devices").await, 0);
    assert_eq!(db.count("SELECT count(*) FROM push_subscriptions").await, 0);
    api.stop().await;
}

#[tokio::test]
async fn every_watch_rule_refuses_bad_input_with_a_problem() {
    let (db, api) = ApiServer::on_fresh_db().await;
    let (_, token) = api.register().await;
    let post = |body: Value| {
        api.req(Method::POST, "/v1/watches", Some(&token))
            .json(&body)
            .send()
    };
    let cases = [
        (
            json!({"item_code": "", "triggers": [below(100)]}),
            "/item_code",
        ),
        (
            json!({"item_code": "x".repeat(129), "triggers": [below(100)]}),
            "/item_code",
        ),
        (
            json!({"item_code": "SKU 1; DROP", "triggers": [below(100)]}),
            "/item_code",
        ),
        (json!({"item_code": "SKU-1", "triggers": []}), "/triggers"),
        (
            json!({"item_code": "SKU-1", "triggers": (1..=9).map(below).collect::<Vec<_>>()}),
            "/triggers",
        ),
        (
            json!({"item_code": "SKU-1", "triggers": [below(0)]}),
            "/triggers/0/threshold",
        ),
        (
            json!({"item_code": "SKU-1", "triggers": [below(1_000_000_000_001)]}),
            "/triggers/0/threshold",
        ),
        (
            json!({"item_code": "SKU-1", "triggers": [{"kind": "price_drop", "percent": 100}]}),
            "/triggers/0/percent",
        ),
        (
            json!({"item_code": "SKU-1", "triggers": [{"kind": "price_drop", "percent": 300}]}),
            "/triggers/0/percent",
        ),
        (
            json!({"item_code": "SKU-1", "triggers": [{"kind": "price_drop", "percent": 0}]}),
            "/triggers/0/percent",
        ),
        (
            json!({"item_code": "SKU-1", "triggers": [below(100), below(100)]}),
            "/triggers/1",
        ),
        (
            json!({"item_code": "SKU-1", "triggers": [below(100)], "channel": "sms"}),
            "/channel",
        ),
        // Shape errors name their field too: unknown trigger kind, unknown field, wrong type.
        (
            json!({"item_code": "SKU-1", "triggers": [{"kind": "price_above", "threshold": 1}]}),
            "/triggers/0/kind",
        ),
        (
            json!({"item_code": "SKU-1", "triggers": [below(100)], "owner": "me"}),
            "/owner",
        ),
        (
            json!({"item_code": 42, "triggers": [below(100)]}),
            "/item_code",
        ),
    ];
    for (body, at) in cases {
        let p = problem(post(body.clone()).await.unwrap(), 422).await;
        assert_eq!(pointer(&p), at, "{body} -> {p:?}");
    }

    // Not JSON, not declared as JSON, too large.
    let raw = |body: String, ct: &'static str| {
        api.req(Method::POST, "/v1/watches", Some(&token))
            .header("content-type", ct)
            .body(body)
            .send()
    };
    problem(
        raw("{\"item_code\":".into(), "application/json")
            .await
            .unwrap(),
        400,
    )
    .await;
    problem(
        raw(
            "item_code=SKU-1".into(),
            "application/x-www-form-urlencoded",
        )
        .await
        .unwrap(),
        415,
    )
    .await;
    let huge = json!({"item_code": "SKU-1", "triggers": [below(100)], "pad": "x".repeat(20_000)});
    problem(
        raw(huge.to_string(), "application/json").await.unwrap(),
        413,
    )
    .await;
    // PATCH changes only `paused`.
    let ok: Watch = answer(
        post(json!({"item_code": "SKU-1", "triggers": [below(100)]}))
            .await
            .unwrap(),
    )
    .await;
    let p = problem(
        api.send(
            Method::PATCH,
            &format!("/v1/watches/{}", ok.id),
            Some(&token),
            &json!({"paused": true, "triggers": []}),
        )
        .await,
        422,
    )
    .await;
    assert!(p.detail.contains("unknown field"), "{p:?}");
    // Bad query parameters.
    problem(api.get("/v1/watches?limit=0", Some(&token)).await, 400).await;
    problem(api.get("/v1/watches?cursor=zzz", Some(&token)).await, 400).await;
    problem(
        api.get("/v1/notifications?status=lost", Some(&token)).await,
        400,
    )
    .await;

    // The limit (3 in the test settings): one exists, two more fit, the next is refused.
    for item in ["SKU-2", "SKU-3"] {
        assert_eq!(
            post(json!({"item_code": item, "triggers": [below(100)]}))
                .await
                .unwrap()
                .status(),
            201
        );
    }
    let p = problem(
        post(json!({"item_code": "SKU-4", "triggers": [below(100)]}))
            .await
            .unwrap(),
        409,
    )
    .await;
    assert_eq!(p.kind, "/problems/watch-limit");
    // Deleting one frees a slot.
    let r = api
        .call(
            Method::DELETE,
            &format!("/v1/watches/{}", ok.id),
            Some(&token),
        )
        .await;
    assert_eq!(r.status(), 204);
    assert_eq!(
        post(json!({"item_code": "SKU-4", "triggers": [below(100)]}))
            .await
            .unwrap()
            .status(),
        201
    );

    let watches: Vec<(String, Value)> = sqlx::query_as(
        "SELECT item_code, triggers FROM watches WHERE removed_at IS NULL ORDER BY item_code",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let items: Vec<&str> = watches.iter().map(|(i, _)| i.as_str()).collect();
    assert_eq!(
        items,
        ["SKU-2", "SKU-3", "SKU-4"],
        "nothing invalid was stored"
    );
    assert_eq!(db.count("SELECT watch_count::bigint FROM devices").await, 3);
    api.stop().await;
}

#[tokio::test]
async fn concurrent_creates_never_exceed_the_watch_limit() {
    let (db, api) = ApiServer::on_fresh_db().await;
    let (_, token) = api.register().await;
    let creates = (0..12).map(|i| {
        api.req(Method::POST, "/v1/watches", Some(&token))
            .json(
                &json!({"item_code": format!("SKU-{i}"), "triggers": [{"kind": "back_in_stock"}]}),
            )
            .send()
    });
    let statuses: Vec<u16> = futures::future::join_all(creates)
        .await
        .into_iter()
        .map(|r| r.unwrap().status().as_u16())
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        9,
        "{statuses:?}"
    );
    assert_eq!(db.count("SELECT count(*) FROM watches").await, 3);
    api.stop().await;
}

/// The statement concurrent creates share (tidings_store::watch_creates), given a batch directly so its
/// contents are known: each create is authenticated on its own, a device's creates are admitted
/// in order up to its limit, the one-create statement agrees, and two batches racing for one
/// device never exceed it.
#[tokio::test]
async fn a_shared_create_statement_authenticates_each_create_and_keeps_every_limit() {
    use tidings_api::auth::token_hash;
    use tidings_domain::ItemCode;
    use tidings_store::watch_creates::{Admission, Create, NewWatch, many, one};

    let (db, api) = ApiServer::on_fresh_db().await;
    let (a, token_a) = api.register().await;
    let (b, token_b) = api.register().await;
    let (_, token_gone) = api.register().await;
    assert_eq!(
        api.call(Method::DELETE, "/v1/devices/me", Some(&token_gone))
            .await
            .status(),
        204
    );
    // Device A already has one watch: two more fit under the limit of 3.
    assert_eq!(
        api.send(
            Method::POST,
            "/v1/watches",
            Some(&token_a),
            &json!({"item_code": "SKU-0", "triggers": [{"kind": "back_in_stock"}]})
        )
        .await
        .status(),
        201
    );
    let new = NewWatch {
        item: ItemCode::parse("SKU-1").unwrap(),
        triggers: vec![Trigger::BackInStock],
        withdraw: true,
        urgent: false,
        preferences: None,
    };
    let unknown = "x".repeat(43);
    let tokens = [
        &token_a,
        &token_a,
        &token_b,
        &unknown,
        &token_a,
        &token_gone,
        &token_a,
        &token_b,
    ];
    let creates: Vec<Create> = tokens
        .iter()
        .map(|t| Create::new(token_hash(t), WatchId::new(), &new))
        .collect();
    let got = many(&db.pool, 3, &creates).await.unwrap();
    let a_id: DeviceId = DeviceId(a.parse().unwrap());
    let b_id: DeviceId = DeviceId(b.parse().unwrap());
    let kinds: Vec<String> = got
        .iter()
        .map(|g| match g {
            Admission::Created { device_id, .. } if *device_id == a_id => "A".to_string(),
            Admission::Created { device_id, .. } if *device_id == b_id => "B".to_string(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "A",
            "A",
            "B",
            "UnknownToken",
            "AtLimit",
            "UnknownToken",
            "AtLimit",
            "B"
        ]
    );
    // Exactly the admitted ids exist, with the created_at the answer reported.
    for (create, admission) in creates.iter().zip(&got) {
        let stored: Option<chrono::DateTime<Utc>> =
            sqlx::query_scalar("SELECT created_at FROM watches WHERE id = $1")
                .bind(create.id)
                .fetch_optional(&db.pool)
                .await
                .unwrap();
        match admission {
            Admission::Created { at, .. } => assert_eq!(stored, Some(*at)),
            _ => assert_eq!(stored, None, "a refused create left a watch"),
        }
    }
    let counts = |id: DeviceId| {
        let pool = db.pool.clone();
        async move {
            let (counter, live): (i32, i64) = sqlx::query_as(
                "SELECT watch_count, (SELECT count(*) FROM watches w
                                      WHERE w.device_id = d.id AND w.removed_at IS NULL)
                 FROM devices d WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
            (counter, live)
        }
    };
    assert_eq!(counts(a_id).await, (3, 3));
    assert_eq!(counts(b_id).await, (2, 2));
    // The one-create statement (a lone create) answers the same way.
    for (token, expected) in [
        (&token_a, Admission::AtLimit),
        (&unknown, Admission::UnknownToken),
        (&token_gone, Admission::UnknownToken),
    ] {
        let create = Create::new(token_hash(token), WatchId::new(), &new);
        assert_eq!(one(&db.pool, 3, &create).await.unwrap(), expected);
    }
    assert_eq!(counts(a_id).await, (3, 3));

    // Two batches racing for B's last slot: one wins it, the other's creates are refused.
    let batch = || -> Vec<Create> {
        (0..4)
            .map(|_| Create::new(token_hash(&token_b), WatchId::new(), &new))
            .collect()
    };
    let (first, second) = (batch(), batch());
    let (x, y) = tokio::join!(many(&db.pool, 3, &first), many(&db.pool, 3, &second));
    let admitted = x
        .unwrap()
        .into_iter()
        .chain(y.unwrap())
        .filter(|g| matches!(g, Admission::Created { .. }))
        .count();
    assert_eq!(admitted, 1);
    assert_eq!(counts(b_id).await, (3, 3));
    api.stop().await;
}

/// A create Postgres refuses, sharing statements with good ones, fails alone: the queue retries a
/// refused shared statement one create at a time. Ten rounds of eight concurrent creates through
/// a queue with one statement at a time, so most rounds share statements.
#[tokio::test]
async fn a_create_postgres_refuses_fails_alone_and_its_neighbours_are_created() {
    use tidings_api::auth::token_hash;
    use tidings_api::coalesce::CreateQueue;
    use tidings_api::problem::ApiError;
    use tidings_domain::ItemCode;
    use tidings_store::watch_creates::{Admission, NewWatch};

    let (db, api) = ApiServer::on_fresh_db().await;
    let (_, token) = api.register().await;
    let queue = CreateQueue::start(db.pool.clone(), 1000, 64, 1);
    let watch = |triggers: Vec<Trigger>| NewWatch {
        item: ItemCode::parse("SKU-1").unwrap(),
        triggers,
        withdraw: false,
        urgent: false,
        preferences: None,
    };
    let good = watch(vec![Trigger::BackInStock]);
    // No triggers breaks the table's CHECK; the api's validation never lets this through.
    let bad = watch(vec![]);
    for _ in 0..10 {
        let answers = futures::future::join_all((0..8).map(|i| {
            let new = if i == 3 { &bad } else { &good };
            queue.create(token_hash(&token), WatchId::new(), new)
        }))
        .await;
        for (i, a) in answers.iter().enumerate() {
            if i == 3 {
                assert!(matches!(a, Err(ApiError::Db { .. })), "{a:?}");
            } else {
                assert!(matches!(a, Ok(Admission::Created { .. })), "{a:?}");
            }
        }
    }
    assert_eq!(db.count("SELECT count(*) FROM watches").await, 70);
    db.assert_count("SELECT watch_count::bigint FROM devices", 70)
        .await;
    api.stop().await;
}

#[tokio::test]
async fn a_retried_create_with_the_same_idempotency_key_creates_one_watch() {
    let (db, api) = ApiServer::on_fresh_db().await;
    let (_, token) = api.register().await;
    let body = json!({"item_code": "SKU-1", "triggers": [{"kind": "back_in_stock"}]});
    let send = |key: &'static str, body: Value| {
        api.req(Method::POST, "/v1/watches", Some(&token))
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    let first = send("k-1", body.clone()).await.unwrap();
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let location = first.headers()["location"].to_str().unwrap().to_owned();
    let first: Watch = answer(first).await;
    let again = send("k-1", body.clone()).await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(again.headers()["location"], location.as_str());
    let replayed: Watch = answer(again).await;
    assert_eq!(
        (replayed.id, replayed.created_at),
        (first.id, first.created_at)
    );

    // Concurrent retries of a new key: one creates, the rest get its response.
    let answers = futures::future::join_all((0..8).map(|_| send("k-2", body.clone()))).await;
    let mut ids = BTreeSet::new();
    for a in answers {
        let a = a.unwrap();
        assert_eq!(a.status(), 201);
        ids.insert(answer::<Watch>(a).await.id);
    }
    assert_eq!(ids.len(), 1, "{ids:?}");

    // The same key with another body is a client bug, not a retry.
    let p = problem(
        send(
            "k-1",
            json!({"item_code": "SKU-9", "triggers": [{"kind": "back_in_stock"}]}),
        )
        .await
        .unwrap(),
        422,
    )
    .await;
    assert_eq!(pointer(&p), "Idempotency-Key");
    assert_eq!(db.count("SELECT count(*) FROM watches").await, 2);
    assert_eq!(
        format!("/v1/watches/{}", first.id),
        location,
        "a create answers with the watch's Location"
    );

    // A retry after the watch was deleted does not answer with a watch that is not there (the
    // contract fuzzer followed such a Location to a 404).
    let gone = api.call(Method::DELETE, &location, Some(&token)).await;
    assert_eq!(gone.status(), 204);
    let p = problem(send("k-1", body.clone()).await.unwrap(), 409).await;
    assert_eq!(p.kind, "/problems/idempotency-key-spent");
    assert!(p.detail.contains("deleted"), "{p:?}");
    assert_eq!(db.count("SELECT count(*) FROM watches").await, 2);
    api.stop().await;
}

/// The locale a browser registers with is the device's, and operators see it.
#[tokio::test]
async fn a_device_registers_with_the_locale_it_reads() {
    let (_db, api) = ApiServer::on_fresh_db().await;
    let body = json!({
        "subscription": browser_subscription("https://127.0.0.1:9/push/ja"),
        "locale": "ja-JP",
    });
    let r = api.send(Method::POST, "/v1/devices", None, &body).await;
    assert_eq!(r.status(), 201);
    let created: DeviceCreated = answer(r).await;
    assert_eq!(created.locale.as_deref(), Some("ja-JP"));
    let id = created.device_id;
    let view: DeviceView = admin_get(&api, &format!("/v1/admin/devices/{id}")).await;
    assert_eq!(view.locale.as_deref(), Some("ja-JP"), "{view:?}");
    // None given: none kept, and the device reads English.
    let (other, _) = api.register().await;
    let view: DeviceView = admin_get(&api, &format!("/v1/admin/devices/{other}")).await;
    assert!(view.locale.is_none(), "{view:?}");
    api.stop().await;
}

#[tokio::test]
async fn operators_list_count_inspect_and_replay_terminal_rows() {
    let (db, api) = ApiServer::on_fresh_db().await;
    let (device, token) = api.register().await;
    let w = create_watch(&api, &token, "SKU-1", json!([below(1200)])).await;
    let failed = outbox_row(&db.pool, &device, &w.id.to_string(), 1100).await;
    let ended = walk::exhaust(&db.pool, OutboxId(failed), 503).await;
    let admin = Some(ADMIN_TOKEN);

    let listed: OutboxList = answer(
        api.get(
            "/v1/admin/outbox?status=failed&reason=retries_exhausted",
            admin,
        )
        .await,
    )
    .await;
    assert_eq!(listed.items[0].notification.id, failed);
    assert!(listed.kept_from.is_some(), "{listed:?}");
    let none: OutboxList = answer(
        api.get("/v1/admin/outbox?reason=condition_lost", admin)
            .await,
    )
    .await;
    assert!(none.items.is_empty());

    let one: OutboxRow = answer(api.get(&format!("/v1/admin/outbox/{failed}"), admin).await).await;
    assert_eq!(i64::from(one.attempt), i64::from(ended.attempt));
    assert_eq!(one.last_error.as_deref(), Some("push service answered 503"));
    assert_eq!(one.http_status, Some(503));

    let r = replay_row(&api, failed).await;
    assert_eq!(r.status(), 201);
    let replay = answer::<Replayed>(r).await.id;
    let replayed = stored(&db.pool, replay).await;
    assert_eq!(
        (
            replayed.notification.status,
            replayed.notification.replay_of
        ),
        (Status::Pending, Some(OutboxId(failed)))
    );
    let original = stored(&db.pool, failed).await;
    assert_eq!(
        (original.notification.status, original.attempt),
        (Status::Failed, i32::try_from(ended.attempt).unwrap()),
        "the terminal row is untouched"
    );
    let again = problem(replay_row(&api, failed).await, 409).await;
    assert_eq!(again.kind, "/problems/already-replayed");
    problem(replay_row(&api, &replay).await, 409).await;
    // Even once the replay has ended unsent, it is not replayed again: no chains.
    walk(&db.pool, OutboxId(replay), [condition_lost()]).await;
    let chained = problem(replay_row(&api, &replay).await, 409).await;
    assert_eq!(chained.kind, "/problems/is-a-replay", "{chained:?}");
    problem(
        api.call(
            Method::POST,
            &format!("/v1/admin/outbox/{}/replay", Uuid::nil()),
            admin,
        )
        .await,
        404,
    )
    .await;

    let stats: OutboxStats = answer(api.get("/v1/admin/outbox/stats", admin).await).await;
    let states: Vec<_> = (stats.states.iter())
        .map(|c| (c.status, c.reason, c.count))
        .collect();
    let exhausted = Reason::Failed(FailReason::RetriesExhausted);
    let lost = Reason::Dropped(DropReason::ConditionLost);
    assert!(
        states.contains(&(Status::Failed, Some(exhausted), 1)),
        "{stats:?}"
    );
    assert!(
        states.contains(&(Status::Dropped, Some(lost), 1)),
        "{stats:?}"
    );
    assert_eq!(stats.due, 0);
    let one: OutboxRow = answer(api.get(&format!("/v1/admin/outbox/{failed}"), admin).await).await;
    assert_eq!(one.replays, [replay]);
    api.stop().await;
}

/// The problem an operator's `method` on `path` (no body) is answered with, with `status`.
async fn admin_problem(api: &ApiServer, method: Method, path: &str, status: u16) -> Problem {
    problem(api.call(method, path, Some(ADMIN_TOKEN)).await, status).await
}

/// The problem an operator's `POST path` with `body` is answered with, with `status`.
async fn admin_post_refused(api: &ApiServer, path: &str, body: &Value, status: u16) -> Problem {
    problem(
        api.send(Method::POST, path, Some(ADMIN_TOKEN), body).await,
        status,
    )
    .await
}

/// `GET path` as the operator: the answer.
async fn admin_get<T: DeserializeOwned>(api: &ApiServer, path: &str) -> T {
    answer(api.get(path, Some(ADMIN_TOKEN)).await).await
}

/// An operator's action without a body (`POST path`, e.g. a pause): the answer, after checking
/// it is 200.
async fn admin_act<T: DeserializeOwned>(api: &ApiServer, path: &str) -> T {
    admin_post(api, path, &json!(null), 200).await
}

/// `POST path` with a JSON body as the operator; the answer after checking its status.
async fn admin_post<T: DeserializeOwned>(
    api: &ApiServer,
    path: &str,
    body: &Value,
    status: u16,
) -> T {
    let r = api.send(Method::POST, path, Some(ADMIN_TOKEN), body).await;
    assert_eq!(r.status(), status, "POST {path} {body}");
    answer(r).await
}

#[tokio::test]
async fn bulk_replay_takes_only_matching_rows_once_each_in_resumable_batches() {
    let (db, api) = ApiServer::on_fresh_db().await;
    // One watch per device and item: each row on SKU-1 is another device's.
    let row_on = |item: &'static str, price: i64| {
        let (api, db) = (&api, &db);
        async move {
            let (device, token) = api.register().await;
            let w = create_watch(api, &token, item, json!([below(1200)])).await;
            outbox_row(&db.pool, &device, &w.id.to_string(), price).await
        }
    };
    // Five failed rows on SKU-1 (503 from the push service), one failed on SKU-2, one dropped
    // on SKU-1 for another reason, one still pending.
    let mut matching = Vec::new();
    for _ in 0..5 {
        let id = row_on("SKU-1", 1100).await;
        walk::exhaust(&db.pool, OutboxId(id), 503).await;
        matching.push(id);
    }
    let other = row_on("SKU-2", 1100).await;
    walk::exhaust(&db.pool, OutboxId(other), 503).await;
    let lost = row_on("SKU-1", 1000).await;
    walk(&db.pool, OutboxId(lost), [condition_lost()]).await;
    let pending = row_on("SKU-1", 900).await;
    // One of the five was replayed before: it is not replayed again.
    let earlier = answer::<Replayed>(replay_row(&api, matching[0]).await)
        .await
        .id;

    let filter = json!({"status": "failed", "item": "SKU-1", "http_status": 503});
    let dry: BulkReport = admin_post(
        &api,
        "/v1/admin/outbox/replay",
        &json!({"filter": filter, "dry_run": true}),
        200,
    )
    .await;
    assert_eq!(
        (dry.matched, dry.would_change),
        (Some(5), Some(4)),
        "{dry:?}"
    );
    let sampled: BTreeSet<Uuid> = dry.sample.iter().map(|r| r.id).collect();
    assert_eq!(sampled, matching[1..].iter().copied().collect(), "{dry:?}");
    assert_eq!(
        db.count("SELECT count(*) FROM outbox").await,
        9,
        "a dry run changes nothing"
    );

    // Batches of two: the client goes on from each cursor until there is none.
    let mut body = json!({"filter": filter, "batch": 2});
    let mut calls = 0;
    let (mut examined, mut changed) = (0, 0);
    let mut skipped = BTreeMap::new();
    loop {
        let report: BulkReport = admin_post(&api, "/v1/admin/outbox/replay", &body, 200).await;
        calls += 1;
        examined += report.examined;
        changed += report.changed;
        for (why, n) in report.skipped {
            *skipped.entry(why).or_insert(0) += n;
        }
        let Some(next) = report.next_cursor else {
            break;
        };
        body = json!({"filter": filter, "batch": 2, "cursor": next, "up_to": report.up_to});
    }
    assert_eq!((calls, examined, changed), (3, 5, 4));
    assert_eq!(
        skipped,
        BTreeMap::from([("already_replayed".to_owned(), 1)])
    );
    let replayed: Vec<Uuid> = sqlx::query_scalar(
        "SELECT replay_of FROM outbox WHERE replay_of IS NOT NULL ORDER BY replay_of",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(replayed, matching, "each matching row once, nothing else");
    db.assert_count(
        &format!(
            "SELECT count(*) FROM outbox WHERE replay_of IN ('{other}', '{lost}', '{pending}')"
        ),
        0,
    )
    .await;

    // Again, over everything failed or dropped: the replays are pending, the originals were
    // replayed; nothing new, and no replay of a replay.
    let again: BulkReport = admin_post(&api, "/v1/admin/outbox/replay", &json!({}), 200).await;
    assert_eq!(
        again.changed, 2,
        "only SKU-2's row and the condition_lost row: {again:?}"
    );
    let twice: BulkReport = admin_post(&api, "/v1/admin/outbox/replay", &json!({}), 200).await;
    assert_eq!(twice.changed, 0, "{twice:?}");
    let skipped = BTreeMap::from([
        ("already_replayed".to_owned(), 7),
        ("is_a_replay".to_owned(), 7),
        ("not_replayable".to_owned(), 1),
    ]);
    assert_eq!(twice.skipped, skipped, "{twice:?}");
    walk(&db.pool, OutboxId(earlier), [condition_lost()]).await;
    let chained: BulkReport = admin_post(
        &api,
        "/v1/admin/outbox/replay",
        &json!({"filter": {"status": "dropped"}}),
        200,
    )
    .await;
    assert_eq!(
        (chained.changed, chained.skipped.get("is_a_replay")),
        (0, Some(&1)),
        "{chained:?}"
    );

    // Bad input: a clear error, nothing changed.
    let before = db.count("SELECT count(*) FROM outbox").await;
    let p = admin_post_refused(
        &api,
        "/v1/admin/outbox/replay",
        &json!({"filter": {"reason": "bogus"}}),
        400,
    )
    .await;
    assert!(p.detail.contains("bogus"), "{p:?}");
    admin_post_refused(
        &api,
        "/v1/admin/outbox/replay",
        &json!({"filter": {"colour": "red"}}),
        422,
    )
    .await;
    admin_post_refused(&api, "/v1/admin/outbox/replay", &json!({"batch": 0}), 400).await;
    // A reversed time range matches nothing; it is not an error.
    let reversed: BulkReport = admin_post(
        &api,
        "/v1/admin/outbox/replay",
        &json!({"filter": {"from": "2026-02-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "dry_run": true}),
        200,
    )
    .await;
    assert_eq!(reversed.matched, Some(0), "{reversed:?}");
    // The channel narrows too: these rows are all Web Push.
    for (channel, some) in [("web_push", true), ("webhook", false)] {
        let found: BulkReport = admin_post(
            &api,
            "/v1/admin/outbox/replay",
            &json!({"filter": {"channel": channel}, "dry_run": true}),
            200,
        )
        .await;
        assert_eq!(found.matched.unwrap() > 0, some, "{channel}: {found:?}");
    }
    let p = admin_post_refused(
        &api,
        "/v1/admin/outbox/replay",
        &json!({"filter": {"channel": "sms"}}),
        400,
    )
    .await;
    assert!(p.detail.contains("web_push, webhook"), "{p:?}");
    // A whole number written with a fraction is still whole (JSON Schema's integer); a real
    // fraction is refused.
    let whole: BulkReport = admin_post(
        &api,
        "/v1/admin/outbox/replay",
        &json!({"batch": 2.0, "dry_run": true}),
        200,
    )
    .await;
    assert!(whole.matched.unwrap() > 0, "{whole:?}");
    admin_post_refused(&api, "/v1/admin/outbox/replay", &json!({"batch": 2.5}), 422).await;
    problem(
        api.send(Method::POST, "/v1/admin/outbox/replay", None, &json!({}))
            .await,
        401,
    )
    .await;
    assert_eq!(db.count("SELECT count(*) FROM outbox").await, before);
    // A NUL, which no text in Postgres holds, is a clear 400, not a failed query.
    admin_problem(&api, Method::GET, "/v1/admin/outbox?push_host=a%00b", 400).await;
    // The list takes the same filter.
    let listed: OutboxList = admin_get(
        &api,
        "/v1/admin/outbox?status=failed&item=SKU-1&http_status=503",
    )
    .await;
    assert_eq!(listed.items.len(), 5, "{listed:?}");
    api.stop().await;
}

#[tokio::test]
async fn operators_cancel_due_rows_only_and_pause_devices_and_watches() {
    let db = TestDb::new().await.unwrap();
    let api = ApiServer::start(
        db.pool.clone(),
        Settings {
            max_watches_per_device: 4,
            ..test_settings()
        },
    )
    .await;
    let (device, token) = api.register().await;
    let mut rows = Vec::new();
    for item in ["SKU-1", "SKU-2", "SKU-3", "SKU-4"] {
        let w = create_watch(&api, &token, item, json!([below(1200)])).await;
        rows.push(outbox_row(&db.pool, &device, &w.id.to_string(), 1100).await);
    }
    walk(
        &db.pool,
        OutboxId(rows[1]),
        [Event::Dispatched, Event::Transient],
    )
    .await;
    walk(&db.pool, OutboxId(rows[2]), [Event::Dispatched]).await;
    walk(&db.pool, OutboxId(rows[3]), [condition_lost()]).await;

    // One row: pending → cancelled; a row with a push out, or one that ended, is refused.
    let done: Cancelled = admin_act(&api, &format!("/v1/admin/outbox/{}/cancel", rows[0])).await;
    assert_eq!(
        (done.status, done.reason),
        (Status::Dropped, Reason::Dropped(DropReason::Cancelled))
    );
    for id in [rows[2], rows[3], rows[0]] {
        let p = admin_problem(
            &api,
            Method::POST,
            &format!("/v1/admin/outbox/{id}/cancel"),
            409,
        )
        .await;
        assert_eq!(p.kind, "/problems/not-cancellable", "{p:?}");
    }
    admin_problem(
        &api,
        Method::POST,
        &format!("/v1/admin/outbox/{}/cancel", Uuid::nil()),
        404,
    )
    .await;

    // In bulk: the dry run counts the one due row left; the run cancels it and skips the rest.
    let dry: BulkReport = admin_post(
        &api,
        "/v1/admin/outbox/cancel",
        &json!({"filter": {"device_id": device}, "dry_run": true}),
        200,
    )
    .await;
    assert_eq!(
        (dry.matched, dry.would_change),
        (Some(4), Some(1)),
        "{dry:?}"
    );
    assert_eq!(dry.sample[0].id, rows[1]);
    let run: BulkReport = admin_post(
        &api,
        "/v1/admin/outbox/cancel",
        &json!({"filter": {"device_id": device}}),
        200,
    )
    .await;
    assert_eq!(
        (run.changed, run.skipped.get("not_cancellable")),
        (1, Some(&3)),
        "{run:?}"
    );
    let mut states = Vec::new();
    for id in &rows {
        let n = stored(&db.pool, *id).await.notification;
        states.push((n.status, n.reason));
    }
    let cancelled = Some(Reason::Dropped(DropReason::Cancelled));
    assert_eq!(
        states,
        [
            (Status::Dropped, cancelled),
            (Status::Dropped, cancelled),
            (Status::Sending, None),
            (
                Status::Dropped,
                Some(Reason::Dropped(DropReason::ConditionLost))
            )
        ]
    );
    // The device sees them as not delivered, not as withheld.
    let history: NotificationList = answer(api.get("/v1/notifications", Some(&token)).await).await;
    let shown: Vec<Delivery> = (history.items.iter())
        .filter(|n| n.reason == cancelled)
        .map(|n| n.delivery)
        .collect();
    assert_eq!(shown, [Delivery::NotDelivered; 2], "{history:?}");
    // Nobody but an operator's cancel may record the reason, and not on a row in flight (raw SQL
    // on purpose: the write the database must refuse).
    let refused = sqlx::query("UPDATE outbox SET status = 'dropped', reason = 'cancelled', finished_at = now() WHERE id = $1")
        .bind(rows[2]).execute(&db.pool).await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("only a pending or retrying row can be cancelled"),
        "{refused}"
    );

    // Pause and resume a device.
    let view: DeviceView = admin_get(&api, &format!("/v1/admin/devices/{device}")).await;
    assert!(view.paused_at.is_none(), "{view:?}");
    assert_eq!(view.watch_count, 4);
    assert_eq!(view.outbox.get(&Status::Dropped), Some(&3), "{view:?}");
    let paused: DeviceView = admin_act(&api, &format!("/v1/admin/devices/{device}/pause")).await;
    let at = paused.paused_at.unwrap();
    let again: DeviceView = admin_act(&api, &format!("/v1/admin/devices/{device}/pause")).await;
    assert_eq!(
        again.paused_at,
        Some(at),
        "pausing twice keeps the first time"
    );
    let resumed: DeviceView = admin_act(&api, &format!("/v1/admin/devices/{device}/resume")).await;
    assert!(resumed.paused_at.is_none());
    admin_problem(
        &api,
        Method::POST,
        &format!("/v1/admin/devices/{}/pause", Uuid::nil()),
        404,
    )
    .await;

    // And a watch.
    let watch: Uuid = sqlx::query_scalar("SELECT watch_id FROM outbox WHERE id = $1")
        .bind(rows[0])
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let paused: WatchView = admin_act(&api, &format!("/v1/admin/watches/{watch}/pause")).await;
    assert_eq!(
        (paused.watch.paused, paused.watch.item_code.as_str()),
        (true, "SKU-1"),
        "{paused:?}"
    );
    let own: Watch = answer(api.get(&format!("/v1/watches/{watch}"), Some(&token)).await).await;
    assert!(own.paused, "the device sees its watch paused");
    let resumed: WatchView = admin_act(&api, &format!("/v1/admin/watches/{watch}/resume")).await;
    assert!(!resumed.watch.paused);
    admin_problem(
        &api,
        Method::GET,
        &format!("/v1/admin/watches/{}", Uuid::nil()),
        404,
    )
    .await;
    problem(
        api.call(
            Method::POST,
            &format!("/v1/admin/watches/{watch}/pause"),
            Some(&token),
        )
        .await,
        401,
    )
    .await;
    api.stop().await;
}

/// The CLI over the same routes: bulk replay and cancel (dry run, confirmation, the real run),
/// a device paused and resumed, and the exit codes scripts rely on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_replays_cancels_and_pauses_with_exit_codes_scripts_rely_on() {
    let (db, api) = ApiServer::on_fresh_db().await;
    let base = api.base.clone();
    let run = |args: Vec<String>| {
        let base = base.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                cli(&base, ADMIN_TOKEN, &args)
            })
            .await
            .unwrap()
        }
    };
    let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let (device, token) = api.register().await;
    let mut rows = Vec::new();
    for item in ["SKU-1", "SKU-2", "SKU-3"] {
        let w = create_watch(&api, &token, item, json!([below(1200)])).await;
        rows.push(outbox_row(&db.pool, &device, &w.id.to_string(), 1100).await);
    }
    walk::exhaust(&db.pool, OutboxId(rows[0]), 503).await;
    walk::exhaust(&db.pool, OutboxId(rows[1]), 410).await;

    // A bulk change needs a filter (or --all), says what it would do, and acts only with --yes.
    let nothing = run(args(&["outbox", "replay"])).await;
    assert_eq!(nothing.code, 2, "{nothing:?}");
    let asked = run(args(&[
        "outbox",
        "replay",
        "--status",
        "failed",
        "--http-status",
        "503",
    ]))
    .await;
    assert_eq!(asked.code, 0, "{asked:?}");
    assert!(
        asked.stdout.contains("1 rows match; 1 would be replayed"),
        "{asked:?}"
    );
    assert!(asked.stdout.contains(&rows[0].to_string()), "{asked:?}");
    db.assert_count("SELECT count(*) FROM outbox WHERE replay_of IS NOT NULL", 0)
        .await;
    let done = run(args(&[
        "outbox",
        "replay",
        "--status",
        "failed",
        "--http-status",
        "503",
        "--yes",
        "--json",
    ]))
    .await;
    assert_eq!(done.code, 0, "{done:?}");
    /// What `tidings outbox replay --json` prints when it is done.
    #[derive(Deserialize)]
    struct Done {
        changed: u64,
    }
    assert_eq!(done.decoded::<Done>().changed, 1, "{done:?}");
    let replayed: Vec<Uuid> =
        sqlx::query_scalar("SELECT replay_of FROM outbox WHERE replay_of IS NOT NULL")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(replayed, [rows[0]]);
    // By id: a replay of a replay is refused (exit 4), as is replaying twice.
    let again = run(args(&["outbox", "replay", &rows[0].to_string()])).await;
    assert_eq!(again.code, 4, "{again:?}");
    assert!(again.stderr.contains("already replayed"), "{again:?}");

    // Cancel the pending row; a failed one is refused.
    let cancelled = run(args(&["outbox", "cancel", &rows[2].to_string()])).await;
    assert_eq!(cancelled.code, 0, "{cancelled:?}");
    let refused = run(args(&["outbox", "cancel", &rows[1].to_string()])).await;
    assert_eq!(refused.code, 4, "{refused:?}");
    assert_eq!(
        stored(&db.pool, rows[2]).await.notification.reason,
        Some(Reason::Dropped(DropReason::Cancelled))
    );

    // Pause and resume a device; show it.
    let paused = run(args(&["device", "pause", &device, "--json"])).await;
    assert_eq!(paused.code, 0, "{paused:?}");
    assert!(paused.decoded::<DeviceView>().paused_at.is_some());
    let shown = run(args(&["device", "show", &device])).await;
    assert!(shown.stdout.contains("paused_at:"), "{shown:?}");
    assert!(!shown.stdout.contains("paused_at:   —"), "{shown:?}");
    let resumed = run(args(&["device", "resume", &device, "--json"])).await;
    assert!(
        resumed.decoded::<DeviceView>().paused_at.is_none(),
        "{resumed:?}"
    );

    // The listing and stats read the same rows.
    let listed = run(args(&["outbox", "ls", "--status", "failed", "--json"])).await;
    assert_eq!(listed.decoded::<Vec<OutboxRow>>().len(), 2, "{listed:?}");
    let stats = run(args(&["outbox", "stats"])).await;
    assert!(stats.stdout.contains("cancelled"), "{stats:?}");

    // Exit codes: not found, a wrong token, no token.
    let missing = run(args(&["outbox", "show", &Uuid::nil().to_string()])).await;
    assert_eq!(missing.code, 3, "{missing:?}");
    let wrong = tokio::task::spawn_blocking({
        let base = api.base.clone();
        move || {
            cli(
                &base,
                "wrong-token-0123456789abcdef0123456789",
                &["outbox", "stats"],
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(wrong.code, 5, "{wrong:?}");
    // Dead-letter sequences start at 1: 0 names none, before NATS is even asked.
    problem(api.get("/v1/admin/dlq/0", Some(ADMIN_TOKEN)).await, 404).await;
    // The dead-letter routes need NATS, which this api was not given: said, not hidden.
    let no_nats = run(args(&["dlq", "ls"])).await;
    assert_eq!(no_nats.code, 6, "{no_nats:?}");
    assert!(no_nats.stderr.contains("TIDINGS_API_NATS"), "{no_nats:?}");
    api.stop().await;
}

/// The CLI decodes each answer as the api's own type: an answer of another shape (another
/// version of Tidings behind the URL) is an error that says so (exit code 6), not a table of
/// dashes.
#[tokio::test]
async fn the_cli_refuses_an_answer_it_cannot_read() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut conn in listener.incoming().flatten() {
            let mut request = [0u8; 4096];
            let _ = conn.read(&mut request);
            let body = r#"{"healthy": true}"#;
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let run = tokio::task::spawn_blocking(move || cli(&base, ADMIN_TOKEN, &["doctor"]))
        .await
        .unwrap();
    assert_eq!(run.code, 6, "{run:?}");
    assert!(
        run.stderr
            .contains("/v1/admin/doctor: the answer is not what this version of tidings expects"),
        "{run:?}"
    );
    assert!(run.stderr.contains("missing field `ok`"), "{run:?}");
    assert!(!run.stdout.contains("ok    api"), "{run:?}");
}

#[tokio::test]
async fn health_probes_answer() {
    let db = TestDb::new().await.unwrap();
    let api = ApiServer::start(db.pool.clone(), Settings::default()).await;
    for path in ["/livez", "/readyz"] {
        let r = api.get(path, None).await;
        assert_eq!(r.status(), 200, "{path}");
    }
    // Without a configured key the browser gets a clear 503, not an empty key.
    problem(api.get("/v1/vapid-public-key", None).await, 503).await;
    problem(api.get("/v1/admin/outbox", Some(ADMIN_TOKEN)).await, 401).await;
    problem(api.get("/no/such/route", None).await, 404).await;
    api.stop().await;
}

#[tokio::test]
async fn the_openapi_document_is_valid_3_1_and_matches_the_router() {
    let (_db, api) = ApiServer::on_fresh_db().await;
    let text = api.get("/openapi.json", None).await.text().await.unwrap();
    let doc: Document = serde_json::from_str(&text).unwrap();
    assert_eq!(doc.openapi, "3.1.0");

    let file = std::env::temp_dir().join(format!("tidings-openapi-{}.json", Uuid::new_v4()));
    std::fs::write(&file, &text).unwrap();
    tidings_testkit::harness::succeeds(
        std::process::Command::new(tool("openapi-spec-validator").unwrap())
            .args(["--schema", "3.1"])
            .arg(&file),
        "openapi-spec-validator",
    );
    let _ = std::fs::remove_file(&file);
    // Named sets are documented by the names they are sent by (a derive that missed serde's
    // renames once documented `Pending` while the api sent `pending`).
    let names = |set: &str| doc.names(set);
    use tidings_domain::messages::AttemptOutcome;
    use tidings_domain::outbox::{Delivery, Status};
    assert_eq!(names("Status"), Status::ALL.map(|v| v.to_string()));
    assert_eq!(
        names("Channel"),
        tidings_domain::Channel::ALL.map(|v| v.to_string())
    );
    assert_eq!(
        names("AttemptOutcome"),
        AttemptOutcome::ALL.map(|v| v.to_string())
    );
    assert_eq!(names("Delivery"), Delivery::ALL.map(|v| v.to_string()));
    assert_eq!(
        names("Shown"),
        tidings_domain::shown::Shown::ALL.map(|v| v.to_string())
    );

    let documented: BTreeSet<(String, String)> = (doc.paths.iter())
        .flat_map(|(path, item)| {
            item.keys()
                .map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect();
    // The surface the api promises (issue #6), each route documented...
    let promised = [
        ("POST", "/v1/devices"),
        ("PUT", "/v1/devices/me/subscription"),
        ("GET", "/v1/devices/me"),
        ("PATCH", "/v1/devices/me"),
        ("DELETE", "/v1/devices/me"),
        ("GET", "/v1/vapid-public-key"),
        ("POST", "/v1/watches"),
        ("GET", "/v1/watches"),
        ("GET", "/v1/watches/{id}"),
        ("PATCH", "/v1/watches/{id}"),
        ("DELETE", "/v1/watches/{id}"),
        ("GET", "/v1/notifications"),
        ("GET", "/v1/notifications/{id}/now"),
        ("POST", "/v1/notifications/{id}/shown"),
        ("POST", "/v1/items/changed"),
        ("GET", "/v1/email/confirm"),
        ("POST", "/v1/email/confirm"),
        ("GET", "/v1/email/unsubscribe"),
        ("POST", "/v1/email/unsubscribe"),
        ("GET", "/n/{id}"),
        ("POST", "/v1/email/bounces"),
        ("POST", "/v1/endpoints"),
        ("GET", "/v1/endpoints/me"),
        ("POST", "/v1/endpoints/me/secret"),
        ("GET", "/v1/endpoints/me/attempts"),
        ("POST", "/v1/endpoints/me/recover"),
        ("POST", "/v1/admin/clients"),
        ("GET", "/v1/admin/clients"),
        ("DELETE", "/v1/admin/clients/{id}"),
        ("GET", "/v1/admin/outbox"),
        ("GET", "/v1/admin/outbox/{id}"),
        ("GET", "/v1/admin/outbox/stats"),
        ("POST", "/v1/admin/outbox/{id}/replay"),
        ("GET", "/v1/admin/outbox/{id}/attempts"),
        ("POST", "/v1/admin/outbox/{id}/cancel"),
        ("POST", "/v1/admin/outbox/replay"),
        ("POST", "/v1/admin/outbox/cancel"),
        ("GET", "/v1/admin/devices/{id}"),
        ("POST", "/v1/admin/devices/{id}/pause"),
        ("POST", "/v1/admin/devices/{id}/resume"),
        ("GET", "/v1/admin/watches/{id}"),
        ("POST", "/v1/admin/watches/{id}/pause"),
        ("POST", "/v1/admin/watches/{id}/resume"),
        ("GET", "/v1/admin/dlq"),
        ("GET", "/v1/admin/dlq/{sequence}"),
        ("POST", "/v1/admin/dlq/redrive"),
        ("POST", "/v1/admin/dlq/purge"),
        ("GET", "/v1/admin/doctor"),
        ("GET", "/v1/admin/audit"),
        ("GET", "/livez"),
        ("GET", "/readyz"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
    ];
    let promised: BTreeSet<(String, String)> = promised
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(documented, promised);
    // ...and every documented route served: the router's fallback (route not found) and its 405
    // never answer a documented (method, path).
    for (method, path) in &documented {
        let concrete = path
            .replace("{id}", &Uuid::nil().to_string())
            .replace("{sequence}", "1");
        let r = api
            .req(
                Method::from_bytes(method.as_bytes()).unwrap(),
                &concrete,
                None,
            )
            .send()
            .await
            .unwrap();
        assert_ne!(r.status(), 405, "{method} {path}");
        let body = r.text().await.unwrap();
        assert!(
            !body.contains("route not found"),
            "{method} {path} is documented but not served"
        );
    }
    // A body over the limit is refused with a problem document on every route that takes one
    // (the bounce route once answered axum's plain text: the contract fuzzer), and the signed
    // routes, which read the body before any key, answer 413.
    let over = "x".repeat(test_settings().max_body_bytes + 1);
    // (The email links' pages take no body and answer HTML, as their document says.)
    let pages = ["/v1/email/confirm", "/v1/email/unsubscribe"];
    let takes_body =
        |(m, p): &&(String, String)| m != "GET" && m != "DELETE" && !pages.contains(&p.as_str());
    for (method, path) in documented.iter().filter(takes_body) {
        let concrete = path.replace("{id}", &Uuid::nil().to_string());
        let r = (api.req(
            Method::from_bytes(method.as_bytes()).unwrap(),
            &concrete,
            None,
        ))
        .header("content-type", "application/json")
        .body(over.clone())
        .send()
        .await
        .unwrap();
        let status = r.status().as_u16();
        let p = problem(r, status).await;
        if ["/v1/items/changed", "/v1/email/bounces"].contains(&path.as_str()) {
            assert_eq!(status, 413, "{method} {path}: {p:?}");
        }
    }
    // Text filters refuse a NUL (Postgres text cannot hold one), and the document says so, or a
    // client generating from it sends one and gets a 400 it was not told of (the fuzzer did).
    let text_filters: Vec<&Parameter> = (doc.parameters("/v1/admin/outbox", "get").iter())
        .filter(|p| p.name == "item" || p.name == "push_host")
        .collect();
    assert_eq!(text_filters.len(), 2);
    for p in text_filters {
        assert_eq!(p.schema.pattern.as_deref(), Some("^[^\\u0000]*$"), "{p:?}");
    }
    // Every problem status a handler can answer is documented on it.
    for (path, item) in &doc.paths {
        for (method, op) in item {
            assert!(!op.responses.is_empty(), "{method} {path}");
        }
    }
    api.stop().await;
}

/// Regressions for what a contract fuzzer and an attacker found: every answer is the documented
/// one, as a problem document.
#[tokio::test]
async fn probed_edges_answer_as_documented() {
    let (_db, api) = ApiServer::on_fresh_db().await;
    let (_, token) = api.register().await;
    let device = Some(token.as_str());
    let admin = Some(ADMIN_TOKEN);

    // A path id that is not UTF-8 names nothing: 404, not axum's 400 text/plain.
    for (path, token) in [("/v1/watches/%ff", device), ("/v1/admin/outbox/%ff", admin)] {
        problem(api.get(path, token).await, 404).await;
    }
    problem(
        api.call(Method::POST, "/v1/admin/outbox/%ff/replay", admin)
            .await,
        404,
    )
    .await;

    // A reason filter names a known reason (found by the fuzzer: a NUL byte made Postgres
    // refuse the text, a 500).
    for reason in ["%00", "condition_lost%00", "nonsense"] {
        let path = format!("/v1/admin/outbox?reason={reason}");
        problem(api.get(&path, admin).await, 400).await;
    }
    let known = api
        .get("/v1/admin/outbox?reason=condition_lost", admin)
        .await;
    assert_eq!(known.status(), 200);
    // The document lists the reasons, so a client (or a fuzzer) sends only those.
    let doc: Document = answer(api.get("/openapi.json", None).await).await;
    let parameters = doc.parameters("/v1/admin/outbox", "get");
    let reason = parameters.iter().find(|p| p.name == "reason").unwrap();
    // The parameter names the domain's one list of reasons, which answers' `reason` share.
    assert_eq!(
        reason.schema.reference.as_deref(),
        Some("#/components/schemas/Reason")
    );
    let names = doc.names("Reason");
    let all: Vec<String> = tidings_domain::outbox::Reason::all()
        .map(|r| r.as_str().to_owned())
        .collect();
    assert_eq!(names, all);

    // The router's own refusals are problems too: 405 keeps `Allow`, 414 for a huge target.
    let r = api.call(Method::PUT, "/v1/watches", device).await;
    let allow = r.headers()["allow"].to_str().unwrap().to_owned();
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
    problem(r, 405).await;
    let long = format!("/v1/watches?cursor={}", "a".repeat(9000));
    problem(api.get(&long, device).await, 414).await;

    // The scheme is case-insensitive (RFC 9110).
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let r = api
            .req(Method::GET, "/v1/watches", None)
            .header("authorization", format!("{scheme} {token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }

    // back_in_stock refuses unknown fields like the other triggers; `.` and `..` are no codes.
    let bad_watches = [
        json!({"item_code": "SKU-1", "triggers": [{"kind": "back_in_stock", "threshold": 5}]}),
        json!({"item_code": ".", "triggers": [{"kind": "back_in_stock"}]}),
        json!({"item_code": "..", "triggers": [{"kind": "back_in_stock"}]}),
    ];
    for body in &bad_watches {
        problem(
            api.send(Method::POST, "/v1/watches", device, body).await,
            422,
        )
        .await;
    }
    let ok = json!({"item_code": "SKU-1", "triggers": [{"kind": "back_in_stock"}]});
    assert_eq!(
        api.send(Method::POST, "/v1/watches", device, &ok)
            .await
            .status(),
        201
    );

    // Authentication answers first: an unknown token is 401 whatever the body is.
    let stranger = Some("not-a-token-anyone-was-given-0123456789");
    for body in &bad_watches {
        problem(
            api.send(Method::POST, "/v1/watches", stranger, body).await,
            401,
        )
        .await;
    }
    let not_json = api
        .req(Method::POST, "/v1/watches", stranger)
        .header("content-type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    problem(not_json, 401).await;

    // expirationTime is a number or null.
    for (expiration, status) in [
        (json!("soon"), 422),
        (json!({}), 422),
        (json!(true), 422),
        (json!(1_700_000_000_000.0), 201),
        (Value::Null, 201),
    ] {
        let mut sub = browser_subscription("https://127.0.0.1:9/push/x");
        let fields = sub.as_object_mut().unwrap();
        fields.insert("expirationTime".to_owned(), expiration.clone());
        let r = api
            .send(
                Method::POST,
                "/v1/devices",
                None,
                &json!({"subscription": sub}),
            )
            .await;
        assert_eq!(r.status(), status, "expirationTime {expiration}");
    }
    api.stop().await;
}

/// The abuse limits: registrations per address, creates per device, behind a trusted proxy the
/// forwarded address; 429 problems with Retry-After, counted.
#[tokio::test]
async fn registrations_and_creates_beyond_their_rate_get_429_with_retry_after() {
    use std::time::Duration;
    use tidings_api::limits::Rate;
    let per = |count, secs| {
        Some(Rate {
            count,
            per: Duration::from_secs(secs),
        })
    };
    let db = TestDb::new().await.unwrap();
    let settings = Settings {
        register_rate: per(2, 3600),
        watch_rate_per_device: per(3, 60),
        max_watches_per_device: 100,
        ..test_settings()
    };
    let api = ApiServer::start(db.pool.clone(), settings.clone()).await;
    let refused = |kind: &str| {
        let labels = tidings_runtime::metrics::KindLabels {
            kind: kind.to_owned(),
        };
        tidings_api::metrics::metrics()
            .rate_limited
            .get_or_create(&labels)
            .get()
    };
    let before = refused("register");
    let (_, a) = api.register().await;
    let (_, b) = api.register().await;
    let body = json!({"subscription": browser_subscription("https://127.0.0.1:9/push/x")});
    let third = api.send(Method::POST, "/v1/devices", None, &body).await;
    assert_eq!(third.headers()["retry-after"], "1800", "a token per 30 min");
    let p = problem(third, 429).await;
    assert_eq!(p.kind, "/problems/rate-limited");
    assert_eq!(refused("register"), before + 1);

    for i in 0..3 {
        create_watch(&api, &a, &format!("SKU-{i}"), json!([below(1200)])).await;
    }
    let watch = json!({"item_code": "SKU-9", "triggers": [below(1200)]});
    let fourth = api
        .send(Method::POST, "/v1/watches", Some(&a), &watch)
        .await;
    assert_eq!(fourth.headers()["retry-after"], "20");
    problem(fourth, 429).await;
    let other = api
        .send(Method::POST, "/v1/watches", Some(&b), &watch)
        .await;
    assert_eq!(other.status(), 201, "another device has its own bucket");
    api.stop().await;

    // Behind one trusted proxy the limit keys on the address it forwarded.
    let behind_proxy = Settings {
        register_rate: per(1, 3600),
        trusted_proxies: 1,
        ..settings
    };
    let api = ApiServer::start(db.pool.clone(), behind_proxy).await;
    let register_from = |address: &'static str| {
        api.req(Method::POST, "/v1/devices", None)
            .header("x-forwarded-for", address)
            .json(&body)
            .send()
    };
    assert_eq!(register_from("198.51.100.1").await.unwrap().status(), 201);
    assert_eq!(register_from("198.51.100.1").await.unwrap().status(), 429);
    let spoofed = register_from("10.9.9.9, 198.51.100.1").await.unwrap();
    assert_eq!(
        spoofed.status(),
        429,
        "what the client wrote before the proxy's entry is ignored"
    );
    assert_eq!(register_from("198.51.100.2").await.unwrap().status(), 201);
    api.stop().await;
}

/// With sources known, a watch on an item no source answers for is refused at creation, not
/// left to fail `not_found` at every scan.
#[tokio::test]
async fn a_watch_on_an_item_no_source_answers_for_is_refused() {
    let db = TestDb::new().await.unwrap();
    let mut catalog = tidings_source::SourceConfig::new("http://shop.invalid/items/{item}");
    catalog.sources[0].prefix = "shop:".into();
    let settings = Settings {
        catalog: Some(catalog),
        ..test_settings()
    };
    let api = ApiServer::start(db.pool.clone(), settings).await;
    let (_, token) = api.register().await;
    let below = json!([below(1000)]);
    create_watch(&api, &token, "shop:4711", below.clone()).await;
    for item in ["other:4711", "4711", "shop:.."] {
        let body = json!({"item_code": item, "triggers": below});
        let p = problem(
            api.send(Method::POST, "/v1/watches", Some(&token), &body)
                .await,
            422,
        )
        .await;
        assert_eq!(pointer(&p), "/item_code", "{item}: {p:?}");
        assert!(tells(&p, "no source answers"), "{item}: {p:?}");
    }
    api.stop().await;
}

#[tokio::test]
async fn a_watch_may_name_its_source_and_the_offer_of_a_product_page() {
    let db = TestDb::new().await.unwrap();
    let mut catalog = tidings_source::SourceConfig::new("http://shop.invalid/items/{item}");
    catalog.sources[0].prefix = "shop:".into();
    catalog.sources[0].name = "shop".into();
    let mut pages = catalog.sources[0].clone();
    pages.name = "pages".into();
    pages.prefix = "page:".into();
    pages.format = tidings_source::Format::SchemaOrg;
    catalog.sources.push(pages);
    let settings = Settings {
        catalog: Some(catalog),
        max_watches_per_device: 10,
        ..test_settings()
    };
    let api = ApiServer::start(db.pool.clone(), settings).await;
    let (_, token) = api.register().await;
    let below = json!([below(1000)]);
    let url = "https://shop.example/products/tee?variant=4002";
    let cases = [
        (
            json!({"source": "pages", "offer": {"sku": "TEE-M"}}),
            "page:tee::sku:TEE-M".to_owned(),
        ),
        (
            json!({"source": "pages", "offer": {"gtin": "0012345678905"}}),
            "page:tee::gtin:0012345678905".into(),
        ),
        (
            json!({"source": "pages", "offer": {"url": url}}),
            format!(
                "page:tee::{}",
                tidings_source::OfferSelector::for_url(url).code()
            ),
        ),
        (json!({"source": "shop"}), "shop:tee".into()),
    ];
    for (extra, expected) in cases {
        let mut body = json!({"item_code": "tee", "triggers": below});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let resp = api
            .send(Method::POST, "/v1/watches", Some(&token), &body)
            .await;
        assert_eq!(resp.status(), 201, "{body}");
        let watch: Watch = answer(resp).await;
        assert_eq!(watch.item_code, expected, "{body}");
    }
    let refused = [
        (
            json!({"source": "nowhere"}),
            "/source",
            "no source is named",
        ),
        (
            json!({"source": "shop", "offer": {"sku": "A"}}),
            "/offer",
            "schema.org source only",
        ),
        (
            json!({"source": "pages", "offer": {"sku": "A", "gtin": "12345678"}}),
            "/offer",
            "exactly one",
        ),
        (
            json!({"source": "pages", "offer": {"gtin": "12"}}),
            "/offer",
            "8 to 14 digits",
        ),
        (
            json!({"source": "pages", "offer": {"sku": "A B"}}),
            "/item_code",
            "invalid item code",
        ),
        (
            json!({"item_code": "page:tee::colour:red"}),
            "/item_code",
            "offer selector",
        ),
    ];
    for (extra, at, says) in refused {
        let mut body = json!({"item_code": "tee", "triggers": below});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let p = problem(
            api.send(Method::POST, "/v1/watches", Some(&token), &body)
                .await,
            422,
        )
        .await;
        assert_eq!(pointer(&p), at, "{body}: {p:?}");
        assert!(tells(&p, says), "{body}: {p:?}");
    }
    api.stop().await;
}

#[tokio::test]
async fn only_a_client_key_registers_a_webhook_endpoint_whose_watches_notify_by_webhook() {
    let db = TestDb::new().await.unwrap();
    let mut settings = test_settings();
    settings.webhook_policy.private_hosts = vec!["127.0.0.1:*".into()];
    let api = ApiServer::start(db.pool.clone(), settings).await;
    let url = "https://127.0.0.1:9/hooks/orders";
    let register = |token: Option<String>, body: Value| {
        let api = &api;
        async move {
            api.send(Method::POST, "/v1/endpoints", token.as_deref(), &body)
                .await
        }
    };

    // Clients are the operator's to issue.
    let r = api
        .send(
            Method::POST,
            "/v1/admin/clients",
            None,
            &json!({"name": "shop"}),
        )
        .await;
    problem(r, 401).await;
    let p = admin_post_refused(&api, "/v1/admin/clients", &json!({"name": " "}), 422).await;
    assert_eq!(pointer(&p), "/name");
    let p = admin_post_refused(&api, "/v1/admin/clients", &json!({"name": "a\u{0}b"}), 422).await;
    assert_eq!(pointer(&p), "/name", "a NUL is refused, not a 500");
    // The schema's maxLength counts the name as sent: 101 characters with a leading space are
    // refused, though 100 would be left after trimming (found by the contract fuzzer).
    let long = format!(" {}", "*".repeat(100));
    let p = admin_post_refused(&api, "/v1/admin/clients", &json!({"name": long}), 422).await;
    assert_eq!(pointer(&p), "/name");
    let client: ClientCreated =
        admin_post(&api, "/v1/admin/clients", &json!({"name": "shop"}), 201).await;
    let key = client.key.clone();
    assert!(key.starts_with("tck_"), "{client:?}");

    // Neither no key nor a browser's token registers a URL; nor does a key a URL the pusher
    // would refuse.
    let (_, browser) = api.register().await;
    for token in [None, Some(browser.clone())] {
        problem(register(token, json!({"url": url})).await, 401).await;
    }
    for bad in [
        "http://127.0.0.1:9/in",
        "https://u:p@127.0.0.1/in",
        "ftp://127.0.0.1/in",
    ] {
        let p = problem(register(Some(key.clone()), json!({"url": bad})).await, 422).await;
        assert_eq!(pointer(&p), "/url", "{bad}: {p:?}");
    }
    let p = problem(
        register(
            Some(key.clone()),
            json!({"url": url, "description": "\u{0}"}),
        )
        .await,
        422,
    )
    .await;
    assert_eq!(pointer(&p), "/description");
    let long = format!("{} ", "d".repeat(500));
    let p = problem(
        register(Some(key.clone()), json!({"url": url, "description": long})).await,
        422,
    )
    .await;
    assert_eq!(
        pointer(&p),
        "/description",
        "counted as sent, as the schema says"
    );
    let r = register(
        Some(key.clone()),
        json!({"url": url, "description": "orders"}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let created: EndpointCreated = answer(r).await;
    let token = created.token.clone();
    let secret = created.secret.clone();
    assert!(secret.starts_with("whsec_"), "{created:?}");

    // Its watches notify by webhook; a browser's by Web Push; naming another channel is refused.
    let w = create_watch(&api, &token, "SKU-1", json!([below(1200)])).await;
    assert_eq!(w.channel, Channel::Webhook);
    assert_eq!(
        create_watch(&api, &browser, "SKU-1", json!([below(1200)]))
            .await
            .channel,
        Channel::WebPush
    );
    for (t, other) in [(&token, "web_push"), (&browser, "webhook")] {
        let body = json!({"item_code": "SKU-2", "triggers": [below(1200)], "channel": other});
        let p = problem(
            api.send(Method::POST, "/v1/watches", Some(t), &body).await,
            422,
        )
        .await;
        assert_eq!(pointer(&p), "/channel", "{p:?}");
    }
    // An endpoint's device takes no browser subscription.
    let sub = browser_subscription("https://127.0.0.1:9/push/1");
    problem(
        api.send(
            Method::PUT,
            "/v1/devices/me/subscription",
            Some(&token),
            &sub,
        )
        .await,
        409,
    )
    .await;

    // Its status, and a rotation that keeps the previous secret signing for a while.
    problem(api.get("/v1/endpoints/me", Some(&browser)).await, 404).await;
    let me: EndpointStatus = answer(api.get("/v1/endpoints/me", Some(&token)).await).await;
    assert_eq!(
        (me.url.as_str(), me.active, me.paused_until),
        (url, true, None),
        "{me:?}"
    );
    let r = api
        .call(Method::POST, "/v1/endpoints/me/secret", Some(&token))
        .await;
    assert_eq!(r.status(), 200);
    let rotated: SecretRotated = answer(r).await;
    assert_ne!(rotated.secret, secret);
    let me: EndpointStatus = answer(api.get("/v1/endpoints/me", Some(&token)).await).await;
    assert_eq!(me.previous_secret_until, Some(rotated.previous_valid_until));

    // A revoked key registers nothing more, and its endpoint ends with it: its token no longer
    // works and its subscription is deactivated as client_revoked (regression: both stayed).
    let id = client.client_id;
    for path in [
        "/v1/admin/clients/not-a-uuid".to_owned(),
        format!("/v1/admin/clients/{}", Uuid::now_v7()),
    ] {
        problem(
            api.call(Method::DELETE, &path, Some(ADMIN_TOKEN)).await,
            404,
        )
        .await;
    }
    let path = format!("/v1/admin/clients/{id}");
    let r = api.call(Method::DELETE, &path, Some(ADMIN_TOKEN)).await;
    assert_eq!(r.status(), 204);
    problem(
        api.call(Method::DELETE, &path, Some(ADMIN_TOKEN)).await,
        404,
    )
    .await;
    problem(register(Some(key), json!({"url": url})).await, 401).await;
    problem(api.get("/v1/endpoints/me", Some(&token)).await, 401).await;
    let device = created.device_id;
    let shown: DeviceView = admin_get(&api, &format!("/v1/admin/devices/{device}")).await;
    let reasons: Vec<_> = (shown.subscriptions.iter())
        .map(|s| (s.active, s.deactivation_reason))
        .collect();
    assert_eq!(reasons, [(false, Some(Deactivation::ClientRevoked))]);

    // Operators see each client with its endpoints counted, and each endpoint's device's channel.
    let _: ClientCreated =
        admin_post(&api, "/v1/admin/clients", &json!({"name": "bot"}), 201).await;
    let listed: ClientList = admin_get(&api, "/v1/admin/clients").await;
    let summary: Vec<(&str, i64, bool)> = (listed.items.iter())
        .map(|c| (c.name.as_str(), c.endpoints, c.revoked_at.is_some()))
        .collect();
    assert_eq!(
        summary,
        [("bot", 0, false), ("shop", 0, true)],
        "newest first: {listed:?}"
    );
    problem(api.get("/v1/admin/clients", None).await, 401).await;
    assert_eq!(shown.channel, Channel::Webhook, "{shown:?}");
    api.stop().await;
}

/// Regression: a client could register endpoints without end.
#[tokio::test]
async fn a_client_registers_at_most_its_quota_of_endpoints_at_a_time() {
    let db = TestDb::new().await.unwrap();
    let mut settings = test_settings();
    settings.webhook_policy.private_hosts = vec!["127.0.0.1:*".into()];
    settings.max_endpoints_per_client = 2;
    let api = ApiServer::start(db.pool.clone(), settings).await;
    let client: ClientCreated =
        admin_post(&api, "/v1/admin/clients", &json!({"name": "shop"}), 201).await;
    let key = client.key.as_str();
    let register = |n: usize| {
        let api = &api;
        let body = json!({"url": format!("https://127.0.0.1:9/hooks/{n}")});
        async move {
            api.send(Method::POST, "/v1/endpoints", Some(key), &body)
                .await
        }
    };
    let mut tokens = Vec::new();
    for n in 0..2 {
        let r = register(n).await;
        assert_eq!(r.status(), 201);
        tokens.push(answer::<EndpointCreated>(r).await.token);
    }
    let p = problem(register(2).await, 409).await;
    assert_eq!(p.kind, "/problems/endpoint-limit", "{p:?}");
    // A removed endpoint frees its place.
    let r = api
        .call(Method::DELETE, "/v1/devices/me", Some(&tokens[0]))
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(register(3).await.status(), 201);
    api.stop().await;
}

/// `tidings-api reseal` after a new key was put first: every stored webhook secret (current and
/// rotated-out, sealed under the old key or stored as given before keys existed) is sealed under
/// the new key and opens with it alone to the secret the client holds; a second run changes
/// nothing; a run without the key some secret needs fails and changes nothing.
#[tokio::test]
async fn reseal_seals_every_webhook_secret_under_the_first_key() {
    use std::sync::Arc;
    use tidings_sealing::{SecretKeys, open};
    const OLD: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const NEW: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
    let db = TestDb::new().await.unwrap();
    async fn register(api: &ApiServer, key: &str) -> EndpointCreated {
        let body = json!({"url": "https://127.0.0.1:9/hooks/in"});
        answer(
            api.send(Method::POST, "/v1/endpoints", Some(key), &body)
                .await,
        )
        .await
    }
    // One endpoint while the api had no keys, one sealed under OLD and then rotated.
    let mut plain = test_settings();
    plain.webhook_policy.private_hosts = vec!["127.0.0.1:*".into()];
    let mut sealing = test_settings();
    sealing.webhook_policy.private_hosts = vec!["127.0.0.1:*".into()];
    sealing.webhook_secret_keys = Some(Arc::new(SecretKeys::parse(OLD).unwrap()));
    let api = ApiServer::start(db.pool.clone(), plain).await;
    let client: ClientCreated =
        admin_post(&api, "/v1/admin/clients", &json!({"name": "shop"}), 201).await;
    let key = client.key;
    let first = register(&api, &key).await;
    api.stop().await;
    let api = ApiServer::start(db.pool.clone(), sealing).await;
    let second = register(&api, &key).await;
    let rotated: SecretRotated = answer(
        api.call(Method::POST, "/v1/endpoints/me/secret", Some(&second.token))
            .await,
    )
    .await;
    api.stop().await;
    let given = BTreeSet::from([first.secret, second.secret, rotated.secret]);
    // Each stored secret with its subscription, to which a seal is bound.
    let stored = || async {
        let rows: Vec<(Uuid, String, Option<String>)> =
            sqlx::query_as("SELECT id, secret, previous_secret FROM push_subscriptions")
                .fetch_all(&db.pool)
                .await
                .unwrap();
        rows.into_iter()
            .flat_map(|(id, s, p)| [Some((id, s)), p.map(|p| (id, p))])
            .flatten()
            .collect::<BTreeSet<(Uuid, String)>>()
    };
    let before = stored().await;
    assert_eq!(before.len(), 3);

    let reseal = |keys: &str| {
        let mut command = std::process::Command::new(tidings_testkit::binaries::binary("api"));
        command
            .arg("reseal")
            // As the api's own login, as an operator runs it in an api pod.
            .env(
                "DATABASE_URL",
                tidings_testkit::harness::login_url(&db.url, "api"),
            )
            .env("TIDINGS_WEBHOOK_SECRET_KEYS", keys);
        command
    };
    // Without OLD, what it sealed does not open: left as it is, and the run fails, saying so
    // (the secret stored as given is sealed under NEW all the same).
    let refused = reseal(NEW).output().unwrap();
    assert!(!refused.status.success(), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("1 webhook subscriptions' secrets do not open"),
        "{stderr}"
    );
    let partly = stored().await;
    let old_sealed: Vec<&(Uuid, String)> = before
        .iter()
        .filter(|(_, s)| s.starts_with("sealed2."))
        .collect();
    assert_eq!(old_sealed.len(), 2);
    assert!(old_sealed.iter().all(|s| partly.contains(*s)), "{partly:?}");

    tidings_testkit::harness::succeeds(&mut reseal(&format!("{NEW}\n{OLD}")), "reseal");
    let new = SecretKeys::parse(NEW).unwrap();
    let after = stored().await;
    assert!(
        after.iter().all(|(_, s)| new.sealed_by_first(s)),
        "{after:?}"
    );
    let opened: BTreeSet<String> = (after.iter())
        .map(|(id, s)| open(s, Some(&new), *id).unwrap())
        .collect();
    assert_eq!(
        opened, given,
        "each opens, with NEW alone, to what its client holds"
    );
    tidings_testkit::harness::succeeds(&mut reseal(&format!("{NEW}\n{OLD}")), "reseal again");
    assert_eq!(stored().await, after, "nothing left to seal");

    // Doctor, with NEW alone: every secret opens, sealed under the first key; had it OLD
    // alone, it names NEW's key as missing.
    let doctor = |keys: &str| {
        let mut settings = test_settings();
        settings.webhook_secret_keys = Some(Arc::new(SecretKeys::parse(keys).unwrap()));
        let pool = db.pool.clone();
        async move {
            let api = ApiServer::start(pool, settings).await;
            let found: Diagnosis = admin_get(&api, "/v1/admin/doctor").await;
            api.stop().await;
            (found.checks.into_iter())
                .find(|c| c.name == "webhook secrets")
                .unwrap()
        }
    };
    let fine = doctor(NEW).await;
    assert!(fine.ok, "{fine:?}");
    assert_eq!(fine.detail, "3 sealed under the first key");
    let missing = doctor(OLD).await;
    assert!(!missing.ok, "{missing:?}");
    let new_id = new.ids()[0];
    assert!(missing.detail.contains(new_id), "{missing:?}");
}
