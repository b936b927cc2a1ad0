//! Operator tooling against the real binaries: `doctor` on a healthy pipeline and on one with
//! exactly one fault, and a poison message dead-lettered, its cause fixed, redriven through the
//! api and delivered. The api works NATS as its own user here, with only its permissions.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::time::Instant;
use tidings_domain::outbox::Status;
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::Trigger;
use tidings_tests::fake_push::FakePushService;
use tidings_tests::harness::poll_wait;
use tidings_tests::scenario::Scenario;
use tidings_tests::services::{ADMIN_TOKEN, Pipeline, cli};

const BELOW_1200: Trigger = Trigger::PriceBelow { threshold: 1200 };

async fn admin(p: &Pipeline, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let mut r = reqwest::Client::new()
        .request(method, format!("{}{path}", p.ops_url("api")))
        .bearer_auth(ADMIN_TOKEN);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert!(status.is_success(), "{path}: {status} {text}");
    serde_json::from_str(&text).unwrap()
}

/// The checks that failed: name → detail.
fn failed(diagnosis: &Value) -> Vec<(String, String)> {
    diagnosis["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["ok"] == false)
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["detail"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn doctor_passes_a_healthy_pipeline_and_names_a_missing_consumer() {
    let s = Scenario::new().await;
    let p = Pipeline::start_only(&s, &["api", "dispatcher", "pusher"], &[]).await;
    // A dispatcher is ready once Postgres and NATS answer, and binds its consumers a moment
    // later: asked in that moment, doctor rightly names them missing (this test failed so, now
    // and then, on a busy machine). Healthy means healthy within a few seconds of the start.
    let started = std::time::Instant::now();
    let healthy = loop {
        let answer = admin(&p, reqwest::Method::GET, "/v1/admin/doctor", None).await;
        if failed(&answer).is_empty() || started.elapsed() > std::time::Duration::from_secs(10) {
            break answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(failed(&healthy), [], "{healthy}");
    assert_eq!(healthy["ok"], true);
    let ops = p.ops_url("api");
    let run = cli(&ops, ADMIN_TOKEN, &["doctor"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!run.stdout.contains("FAIL"), "{run:?}");
    assert!(run.stdout.contains("ok    vapid: 1 pusher(s)"), "{run:?}");
    let names: Vec<&str> = healthy["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for expected in [
        "schema",
        "outbox backlog",
        "nats",
        "stream enqueue",
        "stream dlq",
        "consumer dispatcher-ingest",
        "consumer dispatcher-results",
        "consumer pusher",
        "vapid",
    ] {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }

    // The results consumer goes away (an operator's mistake): exactly that is reported.
    s.js.get_stream(s.subjects.stream(StreamKind::Result))
        .await
        .unwrap()
        .delete_consumer("dispatcher-results")
        .await
        .unwrap();
    let broken = admin(&p, reqwest::Method::GET, "/v1/admin/doctor", None).await;
    let faults = failed(&broken);
    assert_eq!(faults.len(), 1, "{broken}");
    assert_eq!(faults[0].0, "consumer dispatcher-results");
    assert!(faults[0].1.contains("missing"), "{}", faults[0].1);
    assert_eq!(broken["ok"], false);
    let run = cli(&ops, ADMIN_TOKEN, &["doctor"]);
    assert_eq!(run.code, 1, "{run:?}");
    let failing: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("FAIL"))
        .collect();
    assert_eq!(failing.len(), 1, "{run:?}");
    assert!(
        failing[0].starts_with("FAIL  consumer dispatcher-results: "),
        "{run:?}"
    );
    // A wrong token and an api that is not there are told apart by the exit code.
    assert_eq!(
        cli(&ops, "not-the-token-0123456789abcdef0123", &["doctor"]).code,
        5
    );
    assert_eq!(cli("http://127.0.0.1:1", ADMIN_TOKEN, &["doctor"]).code, 6);
    p.stop().await;
    s.cleanup().await;
}

#[tokio::test]
async fn doctor_names_a_vapid_key_pair_split_between_the_api_and_the_pusher() {
    let s = Scenario::new().await;
    // The api hands out the public half of another pair than the pusher signs with.
    let (_, other_public) = tidings_webpush::vapid::VapidKey::generate().unwrap();
    let p = Pipeline::start_only(
        &s,
        &["api", "dispatcher", "pusher"],
        &[("TIDINGS_VAPID_PUBLIC_KEY", &other_public)],
    )
    .await;
    let diagnosis = admin(&p, reqwest::Method::GET, "/v1/admin/doctor", None).await;
    let faults = failed(&diagnosis);
    assert_eq!(faults.len(), 1, "{diagnosis}");
    assert_eq!(faults[0].0, "vapid");
    assert!(
        faults[0].1.contains(&other_public) && faults[0].1.contains("401/403"),
        "{}",
        faults[0].1
    );
    let run = cli(&p.ops_url("api"), ADMIN_TOKEN, &["doctor", "--json"]);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(run.json()["ok"], false);
    p.stop().await;
    s.cleanup().await;
}

/// A detection for a watch the database does not have is dead-lettered. Once the watch is back
/// (restored from a backup, say), the operator finds it in the dead-letter stream, redrives it,
/// and the notification is delivered; the dead letter is gone.
#[tokio::test]
async fn a_dead_letter_redriven_after_its_cause_is_fixed_is_delivered() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let p = Pipeline::start_only(&s, &["api", "dispatcher", "pusher"], &[]).await;
    let w = s
        .watcher_at("SKU-1", BELOW_1200, 1000, &push.subscription())
        .await;
    let saved: Value = sqlx::query_scalar("SELECT to_jsonb(w) FROM watches w WHERE id = $1")
        .bind(w.watch)
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM watches WHERE id = $1")
        .bind(w.watch)
        .execute(&s.db.pool)
        .await
        .unwrap();
    s.publish_enqueue(&s.detection(&w, 1000, chrono::Utc::now()), "poison-1")
        .await;

    let started = Instant::now();
    let listed = loop {
        let listed = admin(&p, reqwest::Method::GET, "/v1/admin/dlq?from=enqueue", None).await;
        if !listed["items"].as_array().unwrap().is_empty() {
            break listed;
        }
        poll_wait(started, 20, || "nothing was dead-lettered".into()).await;
    };
    let letter = &listed["items"][0];
    assert!(
        letter["reason"]
            .as_str()
            .unwrap()
            .contains(&format!("watch {} does not exist", w.watch)),
        "{letter}"
    );
    assert_eq!(letter["msg_id"], "poison-1");
    let sequence = letter["sequence"].as_u64().unwrap();
    let one = admin(
        &p,
        reqwest::Method::GET,
        &format!("/v1/admin/dlq/{sequence}"),
        None,
    )
    .await;
    assert!(
        one["payload"]
            .as_str()
            .unwrap()
            .contains(&w.watch.to_string()),
        "{one}"
    );
    assert!(
        one["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h[0] == "Tidings-Dlq-Reason"),
        "{one}"
    );
    assert_eq!(s.db.count("SELECT count(*) FROM outbox").await, 0);

    // Redriven while its cause is still there, it would only come back: a dry run says what
    // would go where, changing nothing.
    let dry = admin(
        &p,
        reqwest::Method::POST,
        "/v1/admin/dlq/redrive",
        Some(serde_json::json!({"filter": {"reason": "does not exist"}, "dry_run": true})),
    )
    .await;
    assert_eq!(
        (dry["matched"].as_u64(), dry["done"].as_u64()),
        (Some(1), Some(1)),
        "{dry}"
    );
    let enqueue_subject = s
        .subjects
        .subject(StreamKind::Enqueue, tidings_domain::Channel::WebPush);
    assert_eq!(dry["redriven_to"][&enqueue_subject], 1, "{dry}");

    // The cause is fixed; the redrive delivers it.
    sqlx::query("INSERT INTO watches SELECT * FROM jsonb_populate_record(NULL::watches, $1)")
        .bind(&saved)
        .execute(&s.db.pool)
        .await
        .unwrap();
    let ops = p.ops_url("api");
    let listed = cli(&ops, ADMIN_TOKEN, &["dlq", "ls"]);
    assert!(listed.stdout.contains("does not exist"), "{listed:?}");
    let seq = sequence.to_string();
    // Without --yes it only says what it would do.
    let asked = cli(&ops, ADMIN_TOKEN, &["dlq", "redrive", &seq]);
    assert_eq!(asked.code, 0, "{asked:?}");
    assert!(asked.stdout.contains("1 would be redriven"), "{asked:?}");
    let done = cli(
        &ops,
        ADMIN_TOKEN,
        &["dlq", "redrive", &seq, "--yes", "--json"],
    );
    assert_eq!(done.code, 0, "{done:?}");
    assert_eq!(done.json()["done"], 1, "{done:?}");
    let started = Instant::now();
    while s.rows(w.watch).await.first().map(|r| r.notification.status) != Some(Status::Sent) {
        poll_wait(started, 20, || {
            format!("not sent: {:?}", p.log("dispatcher"))
        })
        .await;
    }
    assert_eq!(push.received().len(), 1, "delivered once");
    let after = admin(&p, reqwest::Method::GET, "/v1/admin/dlq", None).await;
    assert_eq!(
        after["items"],
        serde_json::json!([]),
        "the dead letter left the stream"
    );
    problem_404(&p, &format!("/v1/admin/dlq/{sequence}")).await;

    // A dead letter that cannot be fixed is purged.
    s.publish_raw_enqueue(b"{not json".to_vec()).await;
    let started = Instant::now();
    loop {
        let listed = admin(&p, reqwest::Method::GET, "/v1/admin/dlq", None).await;
        if !listed["items"].as_array().unwrap().is_empty() {
            break;
        }
        poll_wait(started, 20, || {
            "the malformed message was not dead-lettered".into()
        })
        .await;
    }
    let purged = cli(
        &ops,
        ADMIN_TOKEN,
        &["dlq", "purge", "--from", "enqueue", "--yes"],
    );
    assert_eq!(purged.code, 0, "{purged:?}");
    assert!(
        purged.stdout.contains("1 dead letters match; 1 purged"),
        "{purged:?}"
    );
    let after = admin(&p, reqwest::Method::GET, "/v1/admin/dlq", None).await;
    assert_eq!(after["items"], serde_json::json!([]));
    p.stop().await;
    s.cleanup().await;
}

async fn problem_404(p: &Pipeline, path: &str) {
    let r = reqwest::Client::new()
        .get(format!("{}{path}", p.ops_url("api")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "{path}");
}

/// `tidings-api migrate` applies the schema to an empty database (and fails on one it cannot
/// reach), and `tidings-pusher vapid-keygen` prints a pair whose halves belong together: the one
/// command of each.
#[tokio::test]
async fn the_services_migrate_a_database_and_make_a_vapid_key_pair() {
    let db = tidings_tests::harness::TestDb::empty().await.unwrap();
    let out = std::process::Command::new(tidings_tests::services::binary("api"))
        .args(["migrate"])
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        tidings_store::schema::check(&db.pool).await.unwrap(),
        tidings_store::schema::needed()
    );
    let bad = std::process::Command::new(tidings_tests::services::binary("api"))
        .args(["migrate"])
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .unwrap();
    assert!(!bad.status.success(), "{bad:?}");

    let keys = std::process::Command::new(tidings_tests::services::binary("pusher"))
        .arg("vapid-keygen")
        .output()
        .unwrap();
    assert!(keys.status.success(), "{keys:?}");
    let printed = String::from_utf8(keys.stdout).unwrap();
    let value = |name: &str| {
        printed
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} in {printed}"))
            .to_owned()
    };
    let private =
        tidings_webpush::vapid::VapidKey::parse(&value("TIDINGS_VAPID_PRIVATE_KEY")).unwrap();
    assert_eq!(private.public_key(), value("TIDINGS_VAPID_PUBLIC_KEY"));
}

/// Every change an operator makes is on record under the name of the token that made it, with
/// its status and row count; reads and refused tokens are not; and an action the trail cannot
/// record is not done.
#[tokio::test]
async fn every_operator_action_is_in_the_audit_trail_under_its_tokens_name() {
    use tidings_api_types::audit::AuditList;
    let s = Scenario::new().await;
    let dir = std::env::temp_dir().join(format!("tidings-audit-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let (alice, line) = tidings_api::auth::new_operator_token("alice").unwrap();
    let tokens = dir.join("operators");
    std::fs::write(&tokens, format!("# the on-call rota\n{line}\n")).unwrap();
    let p = Pipeline::start_only(
        &s,
        &["api"],
        &[
            ("TIDINGS_ADMIN_TOKENS_FILE", tokens.to_str().unwrap()),
            ("TIDINGS_ADMIN_TOKEN_NAME", "ops-bot"),
        ],
    )
    .await;
    let http = reqwest::Client::new();
    let call = |token: &str, method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut r = http
            .request(method, format!("{}{path}", p.ops_url("api")))
            .bearer_auth(token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        async move {
            let r = r.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    use reqwest::Method;
    let (status, made) = call(
        &alice,
        Method::POST,
        "/v1/admin/clients",
        Some(serde_json::json!({"name": "shop"})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let dry = serde_json::json!({"filter": {"status": "failed"}, "dry_run": true});
    let (status, _) = call(
        ADMIN_TOKEN,
        Method::POST,
        "/v1/admin/outbox/replay",
        Some(dry),
    )
    .await;
    assert_eq!(status, 200);
    let wrong = "w".repeat(40);
    let (status, _) = call(
        &wrong,
        Method::POST,
        "/v1/admin/clients",
        Some(serde_json::json!({"name": "x"})),
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) = call(&alice, Method::GET, "/v1/admin/clients", None).await;
    assert_eq!(status, 200);
    let client = made["client_id"].as_str().unwrap();
    let (status, _) = call(
        &alice,
        Method::DELETE,
        &format!("/v1/admin/clients/{client}"),
        None,
    )
    .await;
    assert_eq!(status, 204);

    let (status, trail) = call(ADMIN_TOKEN, Method::GET, "/v1/admin/audit", None).await;
    assert_eq!(status, 200);
    let trail: AuditList = serde_json::from_value(trail).unwrap();
    type Seen<'a> = (&'a str, &'a str, bool, Option<i16>, Option<i64>);
    let seen: Vec<Seen> = trail
        .items
        .iter()
        .map(|a| {
            (
                a.operator.as_str(),
                a.action.as_str(),
                a.dry_run,
                a.status,
                a.rows,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                "alice",
                "DELETE /v1/admin/clients/{id}",
                false,
                Some(204),
                Some(1)
            ),
            (
                "ops-bot",
                "POST /v1/admin/outbox/replay",
                true,
                Some(200),
                Some(0)
            ),
            ("alice", "POST /v1/admin/clients", false, Some(201), Some(1)),
        ]
    );
    assert_eq!(trail.items[2].target["body"]["name"], "shop");
    // Pages go back by id; a cursor below the first id is refused, as the document says (the
    // contract fuzzer found it answered 200).
    let (status, page) = call(ADMIN_TOKEN, Method::GET, "/v1/admin/audit?limit=2", None).await;
    assert_eq!(status, 200);
    let cursor = page["next_cursor"].as_i64().unwrap();
    let (_, rest) = call(
        ADMIN_TOKEN,
        Method::GET,
        &format!("/v1/admin/audit?cursor={cursor}"),
        None,
    )
    .await;
    assert_eq!(
        rest["items"][0]["action"], "POST /v1/admin/clients",
        "{rest}"
    );
    // A NUL in the operator filter is a clear 400, not a failed query (regression: the contract
    // fuzzer's `operator=%005b%C3%A3M%11` was a 500).
    for bad in [
        "cursor=0",
        "cursor=-3",
        "limit=0",
        "since=yesterday",
        "operator=%00",
        "operator=%005b%C3%A3M%11&cursor=178",
    ] {
        let (status, _) = call(
            ADMIN_TOKEN,
            Method::GET,
            &format!("/v1/admin/audit?{bad}"),
            None,
        )
        .await;
        assert_eq!(status, 400, "{bad}");
    }
    assert_eq!(
        trail.items[0].target["path"],
        format!("/v1/admin/clients/{client}")
    );

    // The CLI reads the same trail, here one operator's part of it.
    let run = cli(
        &p.ops_url("api"),
        ADMIN_TOKEN,
        &["--json", "audit", "--operator", "alice"],
    );
    let listed = run.json();
    let actions: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["DELETE /v1/admin/clients/{id}", "POST /v1/admin/clients"]
    );

    // No record, no action: with the api unable to write the trail, the change is refused.
    sqlx::query("REVOKE INSERT ON operator_actions FROM tidings_api")
        .execute(&s.db.pool)
        .await
        .unwrap();
    let (status, _) = call(
        &alice,
        Method::POST,
        "/v1/admin/clients",
        Some(serde_json::json!({"name": "unrecorded"})),
    )
    .await;
    assert_eq!(status, 503);
    let clients: i64 =
        sqlx::query_scalar("SELECT count(*) FROM api_clients WHERE name = 'unrecorded'")
            .fetch_one(&s.db.pool)
            .await
            .unwrap();
    assert_eq!(clients, 0);
    p.stop().await;
    s.cleanup().await;
    let _ = std::fs::remove_dir_all(&dir);
}
