//! The whole system: the real binaries (api, detector, dispatcher, pusher) against real Postgres
//! and NATS, the fake catalog and the fake push service (which decrypts every push).

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidings_bus::permissions::{Service, server_config};
use tidings_domain::Channel;
use tidings_domain::WatchId;
use tidings_domain::messages::Subscription;
use tidings_domain::outbox::{DropReason, Reason, Status};
use tidings_domain::subjects::StreamKind;
use tidings_domain::trigger::Trigger;
use tidings_tests::brokers::PrivateNats;
use tidings_tests::demo::{self, Endpoints};
use tidings_tests::fake_catalog::Behavior;
use tidings_tests::fake_push::{Answer, FakePushService};
use tidings_tests::fake_smtp::{FakeSmtp, SmtpOptions};
use tidings_tests::fake_webhooks::FakeWebhookReceiver;
use tidings_tests::fixtures;
use tidings_tests::harness::{self, DB_LOGINS, TestDb, poll_wait, serve, tool};
use tidings_tests::otlp::{Spans, attr, int_attr, traced_pipeline, traced_pipeline_with};
use tidings_tests::scenario::{Scenario, Watcher};
use tidings_tests::services::{ADMIN_TOKEN, Pipeline, SERVICES, binary, cli};

async fn metrics(p: &Pipeline, name: &str) -> String {
    p.metrics(name).await
}

/// Parses with the Prometheus project's own OpenMetrics parser (Python `prometheus_client`),
/// and returns every sample as `name{labels}` → value.
fn parse_metrics(text: &str) -> HashMap<String, f64> {
    let script = r#"
import sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        print(f"{s.name}{{{labels}}} {s.value}")
"#;
    let mut child = std::process::Command::new(tool("python").unwrap())
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "not valid OpenMetrics text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

fn sample(m: &HashMap<String, f64>, key: &str) -> f64 {
    m.get(key).copied().unwrap_or(0.0)
}

type Scrapes = HashMap<&'static str, HashMap<String, f64>>;

/// Every service's metrics, parsed.
async fn scrape_all(p: &Pipeline) -> Scrapes {
    let mut m = HashMap::new();
    for name in SERVICES {
        m.insert(name, parse_metrics(&metrics(p, name).await));
    }
    m
}

#[tokio::test]
async fn the_demo_scenario_sends_withholds_and_retries_and_the_metrics_move() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let push_admin = serve(push.admin_router()).await;
    let webhooks = FakeWebhookReceiver::start().await.unwrap();
    let webhooks_admin = serve(webhooks.admin_router()).await;
    let smtp = FakeSmtp::start(&SmtpOptions::default()).unwrap();
    let dkim = std::env::temp_dir().join(format!("tidings-demo-dkim-{}.pem", uuid::Uuid::new_v4()));
    std::fs::write(&dkim, tidings_email::dkim::generate_ed25519_pem().unwrap()).unwrap();
    let (smtp_port, dkim_file) = (smtp.port.to_string(), dkim.display().to_string());
    let email = [
        ("TIDINGS_SMTP_HOST", "127.0.0.1"),
        ("TIDINGS_SMTP_PORT", smtp_port.as_str()),
        ("TIDINGS_SMTP_SECURITY", "plain"),
        (
            "TIDINGS_EMAIL_FROM",
            "Tidings demo <alerts@tidings.invalid>",
        ),
        ("TIDINGS_DKIM_KEY_FILE", dkim_file.as_str()),
        ("TIDINGS_EMAIL_UNCONFIRMED_WAIT", "500ms"),
    ];
    let p = Pipeline::start(&s, &email).await;
    let before = scrape_all(&p).await;
    series_at_start(&before);

    let report = demo::run(
        Endpoints {
            api: p.url("api"),
            operators: p.ops_url("api"),
            catalog_admin: format!("http://{}/admin/items", s.catalog.addr),
            push_admin: format!("{push_admin}/admin/push"),
            webhooks: webhooks.url("demo"),
            webhooks_admin: format!("{webhooks_admin}/admin/webhooks"),
            mail_folder: smtp.folder().to_owned(),
            admin_token: ADMIN_TOKEN.into(),
        },
        |line| eprintln!("{line}"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\ndispatcher:\n{}", p.log("dispatcher")));

    each_service_logged_in_as_its_own_user(&s).await;
    rows_ended_as_the_story_says(&s, &report).await;
    attempts_as_the_operator_api_and_the_cli_show_them(&p, &report);
    history_shows_the_attempts_without_internals(&report);
    assert_eq!(
        s.db.count("SELECT count(*) FROM baselines").await,
        4,
        "A (alert, then withdrawal), C, D and E moved their baselines; B did not"
    );
    webhook_as_the_endpoint_received_it(&s, &report, &webhooks).await;
    mail_as_the_smtp_server_received_it(&s, &report, &smtp).await;
    let _ = std::fs::remove_file(&dkim);
    pushes_as_the_push_service_decrypted_them(&push);
    metrics_moved_as_the_scenario_ran(&before, &scrape_all(&p).await);
    // The operator's one change in the demo, issuing the client key, is the first on the audit
    // trail (newest first; the checks above made changes of their own).
    let audit = cli(&p.ops_url("api"), ADMIN_TOKEN, &["--json", "audit"]).json();
    let actions: Vec<(&str, &str, i64)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let action = a["action"].as_str().unwrap();
            (
                a["operator"].as_str().unwrap(),
                action,
                a["status"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions.last(),
        Some(&("operator", "POST /v1/admin/clients", 201)),
        "{actions:?}"
    );

    p.stop().await;
    s.cleanup().await;
}

/// D's row went out once, as the webhook the demo verified, carrying that row's id.
async fn webhook_as_the_endpoint_received_it(
    s: &Scenario,
    report: &demo::Report,
    webhooks: &FakeWebhookReceiver,
) {
    let rows = s.rows(WatchId(report.webhook_watch.parse().unwrap())).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].notification.status, Status::Sent);
    assert_eq!(
        report.webhook["webhook-id"],
        rows[0].notification.id.to_string()
    );
    assert_eq!(webhooks.received_by("demo").len(), 1);
}

/// Each service is ready, and the series that alerts take the `increase()` of exist at 0 from
/// the start on the services that feed them; a service exports only the families it feeds.
fn series_at_start(before: &Scrapes) {
    // A ready service says so to a scrape too (the TidingsNotReady alert reads it).
    for name in SERVICES {
        assert_eq!(before[name].get("tidings_ready{}"), Some(&1.0), "{name}");
    }
    for (name, series) in [
        (
            "dispatcher",
            r#"tidings_dead_lettered_total{kind="enqueue"}"#,
        ),
        (
            "dispatcher",
            r#"tidings_dead_lettered_total{kind="result"}"#,
        ),
        ("pusher", r#"tidings_dead_lettered_total{kind="push"}"#),
        (
            "dispatcher",
            r#"tidings_outbox_transitions_total{reason="vapid_rejected",to="failed"}"#,
        ),
        (
            "dispatcher",
            r#"tidings_delivery_log_errors_total{operation="lookup"}"#,
        ),
        (
            "pusher",
            r#"tidings_delivery_log_errors_total{operation="record"}"#,
        ),
        (
            "detector",
            r#"tidings_detections_total{result="published"}"#,
        ),
        ("api", r#"tidings_api_rate_limited_total{kind="register"}"#),
        (
            "dispatcher",
            r#"tidings_failures_total{operation="dispatch"}"#,
        ),
        (
            "dispatcher",
            r#"tidings_failures_total{operation="dispatcher-ingest"}"#,
        ),
        (
            "pusher",
            r#"tidings_failures_total{operation="publish_result"}"#,
        ),
        ("detector", r#"tidings_failures_total{operation="scan"}"#),
    ] {
        assert_eq!(before[name].get(series), Some(&0.0), "{name}: {series}");
    }
    // Read at scrape: the process and, where there is one, the Postgres pool.
    for name in SERVICES {
        let rss = before[name].get("process_resident_memory_bytes{}").copied();
        assert!(rss.is_some_and(|b| b > 1e6), "{name}: {rss:?}");
    }
    for name in ["api", "dispatcher", "detector"] {
        let max = before[name]
            .get("tidings_db_pool_max_connections{}")
            .copied();
        assert!(max.is_some_and(|n| n >= 1.0), "{name}: {max:?}");
        assert!(before[name].contains_key(r#"tidings_db_pool_connections{state="idle"}"#));
    }
    for (name, prefix) in [
        ("pusher", "tidings_db_pool"),
        ("api", "tidings_outbox_rows"),
        ("pusher", "tidings_detector_scans_total"),
        ("detector", "tidings_http_requests_total"),
        ("dispatcher", "tidings_push_requests_total"),
    ] {
        assert!(
            !before[name].keys().any(|k| k.starts_with(prefix)),
            "{name} exports {prefix}"
        );
    }
}

/// Every service did its part logged in as its own user (docs/security.md), not the owner.
async fn each_service_logged_in_as_its_own_user(s: &Scenario) {
    let users: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT usename::text FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid() AND usename <> current_user
          ORDER BY 1",
    )
    .fetch_all(&s.db.pool)
    .await
    .unwrap();
    let mut logins: Vec<&str> = DB_LOGINS.iter().map(|(_, login, _)| *login).collect();
    logins.sort_unstable();
    assert_eq!(users, logins, "the users connected to the test's database");
}

/// A sent at once; B withheld because the re-check saw the price recover; C sent after a 429
/// and a 500.
/// E's one mail (after the confirmation) names its sent row, with the re-checked 9.49.
async fn mail_as_the_smtp_server_received_it(s: &Scenario, report: &demo::Report, smtp: &FakeSmtp) {
    let rows = s.rows(WatchId(report.mail_watch.parse().unwrap())).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].notification.status, Status::Sent);
    let id = rows[0].notification.id;
    assert_eq!(
        report.mail.header("message-id"),
        Some(format!("<{id}@tidings.invalid>").as_str())
    );
    assert!(report.mail.text.contains("9.49"), "{}", report.mail.text);
    assert_eq!(
        smtp.received().len(),
        2,
        "the confirmation and E's notification"
    );
}

async fn rows_ended_as_the_story_says(s: &Scenario, report: &demo::Report) {
    let rows = |code: &str| {
        let (_, w) = report.watches.iter().find(|(c, _)| c == code).unwrap();
        s.rows(WatchId(w.parse().unwrap()))
    };
    let a = rows("SKU-A").await;
    assert_eq!(a.len(), 2, "A's alert and its withdrawal");
    let (alert, withdrawal) = match a[0].notification.withdraws {
        None => (&a[0], &a[1]),
        Some(_) => (&a[1], &a[0]),
    };
    assert_eq!(
        (alert.notification.status, alert.attempt, alert.retry_count),
        (Status::Sent, 1, 0)
    );
    assert_eq!(
        withdrawal.notification.withdraws,
        Some(alert.notification.id)
    );
    assert_eq!(withdrawal.notification.status, Status::Sent);
    assert_eq!(
        withdrawal.notification.sent_value.as_ref().unwrap()["price"],
        1500
    );
    let b = rows("SKU-B").await;
    assert_eq!(b.len(), 1);
    assert_eq!(
        (
            b[0].notification.status,
            b[0].notification.reason,
            b[0].attempt
        ),
        (
            Status::Dropped,
            Some(Reason::Dropped(DropReason::ConditionLost)),
            0
        )
    );
    assert_eq!(
        b[0].notification.checked.as_ref().unwrap()["price"],
        1500,
        "the re-check saw the recovery"
    );
    let c = rows("SKU-C").await;
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].notification.status, c[0].attempt, c[0].retry_count),
        (Status::Sent, 3, 2),
        "a 429, a 500, then sent"
    );
}

/// C's three attempts, as the operator api reports them, and the same from the CLI, for
/// scripts and for people.
fn attempts_as_the_operator_api_and_the_cli_show_them(p: &Pipeline, report: &demo::Report) {
    let attempts: Vec<(i64, &str, Option<i64>)> = report
        .attempts
        .iter()
        .map(|a| {
            (
                a["attempt"].as_i64().unwrap(),
                a["outcome"].as_str().unwrap(),
                a["http_status"].as_i64(),
            )
        })
        .collect();
    let expected = [
        (1, "transient", 429),
        (2, "transient", 500),
        (3, "delivered", 201),
    ];
    let expected_api: Vec<(i64, &str, Option<i64>)> =
        expected.iter().map(|&(n, o, h)| (n, o, Some(h))).collect();
    assert_eq!(attempts, expected_api);
    let c_row = &report
        .outbox
        .iter()
        .find(|r| r["item_code"] == "SKU-C")
        .unwrap();
    for a in &report.attempts {
        assert_eq!(a["push_host"], "127.0.0.1", "{a}");
        assert_eq!(a["subscription_id"], c_row["subscription_id"], "{a}");
        assert!(
            a["started_at"].is_string() && a["duration_ms"].is_i64(),
            "{a}"
        );
        let trace_id = c_row["traceparent"]
            .as_str()
            .and_then(|t| t.split('-').nth(1));
        assert_eq!(a["trace_id"].as_str(), trace_id, "{a}");
    }
    assert!(
        report.attempts[0]["error"]
            .as_str()
            .unwrap()
            .contains("429")
    );
    assert_eq!(
        report.attempts[2]["push_message_id"], c_row["push_message_id"],
        "the delivering attempt names the push service's message"
    );
    cli_shows_the_same(p, report, c_row["id"].as_str().unwrap(), expected);
}

/// C's attempts and rows from the CLI: the same JSON as the api, a table for people, the rows a
/// push host served, and one row in full.
fn cli_shows_the_same(
    p: &Pipeline,
    report: &demo::Report,
    c_id: &str,
    expected: [(i64, &str, i64); 3],
) {
    let ops = p.ops_url("api");
    let from_cli = cli(&ops, ADMIN_TOKEN, &["attempts", c_id, "--json"]);
    assert_eq!(from_cli.code, 0, "{from_cli:?}");
    assert_eq!(from_cli.json(), Value::Array(report.attempts.clone()));
    let table = cli(&ops, ADMIN_TOKEN, &["attempts", c_id]);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three attempts: {table:?}");
    for (line, (n, outcome, http)) in lines[1..].iter().zip(expected) {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            (cells[0], cells[2], cells[3]),
            (n.to_string().as_str(), outcome, http.to_string().as_str()),
            "{line}"
        );
    }
    // The rows with an attempt through host 127.0.0.1: A's two (its alert and its withdrawal),
    // C's, and D's webhook (its receiver is on loopback too), not B's (never sent). The CLI
    // shows the channel of each.
    let by_host = cli(
        &ops,
        ADMIN_TOKEN,
        &["outbox", "ls", "--push-host", "127.0.0.1", "--json"],
    );
    let mut items: Vec<String> = by_host
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["item_code"].as_str().unwrap().to_owned())
        .collect();
    items.sort();
    assert_eq!(items, ["SKU-A", "SKU-A", "SKU-C", "SKU-D"], "{by_host:?}");
    let webhook = (by_host.json().as_array().unwrap().iter())
        .find(|r| r["item_code"] == "SKU-D")
        .map(|r| r["channel"].clone());
    assert_eq!(webhook, Some("webhook".into()));
    let shown = cli(&ops, ADMIN_TOKEN, &["outbox", "show", c_id]);
    assert!(shown.stdout.contains("status:          sent"), "{shown:?}");
    cli_finds_rows_by_channel(&ops);
    cli_manages_clients(&ops);
}

/// The demo's client (with D's endpoint) and a new one: created with its key shown once, listed
/// newest first, revoked once (again is not found).
fn cli_manages_clients(ops: &str) {
    let made = cli(
        ops,
        ADMIN_TOKEN,
        &["client", "create", "relay bot", "--json"],
    );
    assert_eq!(made.code, 0, "{made:?}");
    let made = made.json();
    assert!(made["key"].as_str().unwrap().starts_with("tck_"), "{made}");
    let id = made["client_id"].as_str().unwrap();
    let listed = |args: &[&str]| {
        let run = cli(ops, ADMIN_TOKEN, args);
        assert_eq!(run.code, 0, "{run:?}");
        run
    };
    let clients = listed(&["client", "ls", "--json"]).json();
    let summary: Vec<(&str, i64, bool)> = (clients.as_array().unwrap().iter())
        .map(|c| {
            let name = c["name"].as_str().unwrap();
            (
                name,
                c["endpoints"].as_i64().unwrap(),
                c["revoked_at"].is_null(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [("relay bot", 0, true), ("demo shop backend", 1, true)]
    );
    let revoked = cli(ops, ADMIN_TOKEN, &["client", "revoke", id]);
    assert_eq!(revoked.code, 0, "{revoked:?}");
    let table = listed(&["client", "ls"]).stdout;
    let row: Vec<&str> = (table.lines())
        .find(|l| l.starts_with(id))
        .map(|l| l.split_whitespace().collect())
        .unwrap();
    assert!(row.last().unwrap().starts_with("20"), "revoked at: {table}");
    let again = cli(ops, ADMIN_TOKEN, &["client", "revoke", id]);
    assert_eq!(again.code, 3, "{again:?}");
}

/// Each channel's rows apart, in JSON and in the table; a channel that does not exist is a usage
/// error that names the ones that do.
fn cli_finds_rows_by_channel(ops: &str) {
    let items = |channel: &str| -> Vec<String> {
        let run = cli(
            ops,
            ADMIN_TOKEN,
            &["outbox", "ls", "--channel", channel, "--json"],
        );
        assert_eq!(run.code, 0, "{run:?}");
        let mut items: Vec<String> = (run.json().as_array().unwrap().iter())
            .inspect(|r| assert_eq!(r["channel"], channel, "{r}"))
            .map(|r| r["item_code"].as_str().unwrap().to_owned())
            .collect();
        items.sort();
        items.dedup();
        items
    };
    assert_eq!(items("webhook"), ["SKU-D"]);
    assert_eq!(items("web_push"), ["SKU-A", "SKU-B", "SKU-C"]);
    let table = cli(ops, ADMIN_TOKEN, &["outbox", "ls", "--channel", "webhook"]);
    let lines: Vec<Vec<&str>> = (table.stdout.lines())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0][..3], ["ID", "CHANNEL", "STATUS"], "{table:?}");
    assert!(
        lines[1..].iter().all(|cells| cells[1] == "webhook"),
        "{table:?}"
    );
    let unknown = cli(ops, ADMIN_TOKEN, &["outbox", "ls", "--channel", "sms"]);
    assert_eq!(unknown.code, 2, "{unknown:?}");
    assert!(unknown.stderr.contains("web_push, webhook"), "{unknown:?}");
}

/// The device's own history has C's three attempts, without the internals.
fn history_shows_the_attempts_without_internals(report: &demo::Report) {
    let c_history = report
        .history
        .iter()
        .find(|n| n["item_code"] == "SKU-C")
        .unwrap();
    let summary: Vec<(i64, &str)> = c_history["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let keys: Vec<&String> = a.as_object().unwrap().keys().collect();
            assert_eq!(keys, ["at", "attempt", "outcome"], "{a}");
            (
                a["attempt"].as_i64().unwrap(),
                a["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [(1, "transient"), (2, "transient"), (3, "delivered")]
    );
}

/// What the push service decrypted: A's and C's notifications, after C's 429 and 500.
fn pushes_as_the_push_service_decrypted_them(push: &FakePushService) {
    let bodies: Vec<Value> = push.received().iter().map(|r| r.json()).collect();
    let titles: Vec<&str> = bodies.iter().filter_map(|b| b["title"].as_str()).collect();
    assert_eq!(
        titles,
        [
            "SKU-A is below your price",
            "SKU-C is below your price",
            "SKU-A has changed"
        ]
    );
    assert!(
        bodies[2]["body"]
            .as_str()
            .unwrap()
            .ends_with(", now 15.00 EUR."),
        "{bodies:?}"
    );
    assert_eq!(bodies[2]["tag"], bodies[0]["tag"]);
    assert!(
        bodies[0]["body"].as_str().unwrap().contains("9.99"),
        "{bodies:?}"
    );
    assert!(push.rejected().is_empty(), "{:?}", push.rejected());
    assert_eq!(
        push.hits(),
        6,
        "A, C's 429 and 500, C, the DELETE of A's (delivered: 404), A's withdrawal"
    );
    assert!(push.deleted().is_empty());
}

fn metrics_moved_as_the_scenario_ran(before: &Scrapes, after: &Scrapes) {
    let moved = |svc: &str, key: &str| sample(&after[svc], key) - sample(&before[svc], key);
    let push = |outcome: &str, class: &str| {
        format!(
            r#"tidings_push_requests_total{{channel="web_push",host="127.0.0.1",outcome="{outcome}",status_class="{class}"}}"#
        )
    };
    for (svc, key, n) in [
        (
            "dispatcher",
            r#"tidings_outbox_transitions_total{reason="",to="sent"}"#.to_owned(),
            5.0,
        ),
        (
            "dispatcher",
            r#"tidings_outbox_transitions_total{reason="condition_lost",to="dropped"}"#.to_owned(),
            1.0,
        ),
        (
            "dispatcher",
            r#"tidings_outbox_transitions_total{reason="",to="retry"}"#.to_owned(),
            2.0,
        ),
        (
            "dispatcher",
            r#"tidings_ingested_total{result="new"}"#.to_owned(),
            6.0,
        ),
        (
            "dispatcher",
            "tidings_detection_to_delivery_seconds_count{}".to_owned(),
            5.0,
        ),
        ("pusher", push("delivered", "2xx"), 3.0),
        ("pusher", push("transient", "4xx"), 1.0),
        ("pusher", push("transient", "5xx"), 1.0),
        // D's webhook, counted under one label for every webhook host.
        (
            "pusher",
            concat!(
                r#"tidings_push_requests_total{channel="webhook",host="webhook","#,
                r#"outcome="delivered",status_class="2xx"}"#
            )
            .to_owned(),
            1.0,
        ),
        // E's mail, under one label for every recipient domain.
        (
            "pusher",
            concat!(
                r#"tidings_push_requests_total{channel="email",host="email","#,
                r#"outcome="delivered",status_class="none"}"#
            )
            .to_owned(),
            1.0,
        ),
        (
            "api",
            r#"tidings_http_requests_total{method="POST",route="/v1/watches",status="201"}"#
                .to_owned(),
            5.0,
        ),
        // The five creates (A, B, C by the device, D by the endpoint, E by the email device)
        // went through the create queue, each counted in one statement.
        ("api", "tidings_api_create_batch_size_sum{}".to_owned(), 5.0),
    ] {
        assert_eq!(moved(svc, &key), n, "{svc}: {key}");
    }
    assert!(moved("detector", "tidings_detector_scans_total{}") >= 1.0);
    // The demo's five watches are held in the detector's watchlist and were evaluated.
    assert_eq!(
        sample(&after["detector"], "tidings_detector_watches{}"),
        5.0
    );
    assert!(moved("detector", "tidings_detector_evaluated_watches_total{}") >= 3.0);
    assert!(
        moved(
            "detector",
            r#"tidings_detections_total{result="published"}"#
        ) >= 3.0
    );
    // Every service with a pool timed its acquires (the dispatcher's loops take many).
    for svc in ["api", "dispatcher", "detector"] {
        assert!(
            moved(svc, "tidings_db_pool_acquire_seconds_count{}") >= 1.0,
            "{svc}"
        );
    }
    assert!(!after["pusher"].contains_key("tidings_db_pool_acquire_seconds_count{}"));
}

/// Without `OTEL_EXPORTER_OTLP_PROTOCOL` a service exports protobuf, as documented, under the
/// name `OTEL_SERVICE_NAME` gives, with an instance id that tells replicas apart.
#[tokio::test]
async fn traces_are_protobuf_by_default_under_otel_service_name() {
    let s = Scenario::new().await;
    let bodies: Arc<Mutex<Vec<(String, Bytes)>>> = Arc::default();
    let store = bodies.clone();
    let router = Router::new().route(
        "/v1/traces",
        post(move |headers: axum::http::HeaderMap, body: Bytes| {
            let store = store.clone();
            async move {
                let content_type = headers
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                store.lock().unwrap().push((content_type, body));
                ""
            }
        }),
    );
    let otlp = serve(router).await;
    let _p = Pipeline::start_only(
        &s,
        &["detector"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SERVICE_NAME", "detector-eu-1"),
            ("K8S_POD_NAME", "detector-0"),
        ],
    )
    .await;
    s.watcher("SKU-1", Trigger::PriceBelow { threshold: 1200 }, 1500)
        .await;
    s.catalog.set_price("SKU-1", 1000);
    let started = Instant::now();
    let contains = |body: &[u8], text: &str| body.windows(text.len()).any(|w| w == text.as_bytes());
    loop {
        let got = bodies.lock().unwrap().clone();
        if let Some((content_type, body)) = got.iter().find(|(_, b)| contains(b, "detect")) {
            assert_eq!(content_type, "application/x-protobuf");
            for text in [
                "detector-eu-1",
                "service.instance.id",
                "detector-0",
                "k8s.pod.name",
            ] {
                assert!(contains(body, text), "{text} not in the exported resource");
            }
            // service.name's value follows its key (a few bytes of protobuf framing between).
            let at = body
                .windows(12)
                .position(|w| w == b"service.name")
                .expect("service.name");
            let value = &body[at..(at + 12 + 8 + "detector-eu-1".len()).min(body.len())];
            assert!(
                contains(value, "detector-eu-1"),
                "OTEL_SERVICE_NAME ignored: {:?}",
                String::from_utf8_lossy(value)
            );
            break;
        }
        poll_wait(started, 20, || {
            format!("{} exports, none with a detect span", got.len())
        })
        .await;
    }
}

/// A watcher of SKU-1 below 1200 (at 1500) whose subscription is `push`'s, then the price
/// drops to 1000: one notification to come.
async fn watch_sku1_pushing_to(s: &Scenario, push: &FakePushService) -> Watcher {
    let (w, _) = watch_sku1_subscribed_to(s, push).await;
    s.catalog.set_price("SKU-1", 1000);
    w
}

/// A watcher of SKU-1 below 1200, the price at 1500, and its subscription on `push`.
async fn watch_sku1_subscribed_to(s: &Scenario, push: &FakePushService) -> (Watcher, Subscription) {
    let sub = push.subscription();
    let w = s
        .watcher_at("SKU-1", Trigger::PriceBelow { threshold: 1200 }, 1500, &sub)
        .await;
    (w, sub)
}

/// Every service exporting its spans to the test, and a watcher of SKU-1 (below 1200, the price
/// at 1500) subscribed on a fake push service.
struct Traced {
    s: Scenario,
    push: FakePushService,
    p: Pipeline,
    spans: Spans,
    w: Watcher,
    sub: Subscription,
}

async fn traced() -> Traced {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let (p, spans) = traced_pipeline(&s).await;
    let (w, sub) = watch_sku1_subscribed_to(&s, &push).await;
    Traced {
        s,
        push,
        p,
        spans,
        w,
        sub,
    }
}

#[tokio::test]
async fn one_notification_is_one_trace_across_every_service() {
    // `_push` keeps the fake push service running to the end.
    let Traced {
        s,
        push: _push,
        p,
        spans,
        w,
        ..
    } = traced().await;
    s.catalog.set_price("SKU-1", 1000);

    // Wait for the row to be sent and the result span to arrive.
    let started = Instant::now();
    let names = ["detect", "ingest", "recheck", "fetch", "push", "result"];
    let by_name = loop {
        let got: HashMap<String, Value> = spans
            .lock()
            .unwrap()
            .iter()
            .filter_map(|sp| Some((sp["name"].as_str()?.to_owned(), sp.clone())))
            .collect();
        if names.iter().all(|n| got.contains_key(*n)) {
            break got;
        }
        poll_wait(started, 30, || {
            format!(
                "spans so far: {:?}\ndispatcher log:\n{}",
                got.keys().collect::<Vec<_>>(),
                p.log("dispatcher")
            )
        })
        .await;
    };
    let status: String = sqlx::query_scalar("SELECT status FROM outbox WHERE watch_id = $1")
        .bind(w.watch)
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(status, "sent");

    let trace = by_name["detect"]["traceId"].as_str().unwrap().to_owned();
    assert!(!trace.is_empty());
    for n in names {
        assert_eq!(
            by_name[n]["traceId"].as_str(),
            Some(trace.as_str()),
            "{n} is in another trace"
        );
    }
    // Each consumer span is a child of its producer's span.
    for (child, parent) in [
        ("ingest", "detect"),
        ("recheck", "ingest"),
        ("fetch", "recheck"),
        ("push", "recheck"),
        ("result", "push"),
    ] {
        assert_eq!(
            by_name[child]["parentSpanId"], by_name[parent]["spanId"],
            "{child} should be a child of {parent}"
        );
    }
    // The pusher's log line of this push is in its span: it names the trace and the span.
    let line = p
        .log("pusher")
        .lines()
        .find(|l| l.contains("push attempt finished"))
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .expect("the pusher logged the push");
    assert_eq!(line["trace_id"].as_str(), Some(trace.as_str()), "{line}");
    assert_eq!(line["span_id"], by_name["push"]["spanId"], "{line}");
    let services: HashSet<&str> = names
        .iter()
        .filter_map(|n| by_name[*n]["service"].as_str())
        .collect();
    assert_eq!(
        services,
        HashSet::from(["tidings-detector", "tidings-dispatcher", "tidings-pusher"])
    );
    let outbox_id: uuid::Uuid = sqlx::query_scalar("SELECT id FROM outbox WHERE watch_id = $1")
        .bind(w.watch)
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    for n in ["recheck", "push", "result"] {
        assert_eq!(
            attr(&by_name[n], "outbox_id"),
            Some(outbox_id.to_string()),
            "{n}"
        );
    }
    assert_eq!(
        attr(&by_name["recheck"], "outcome").as_deref(),
        Some("sending")
    );
    assert_eq!(
        attr(&by_name["push"], "outcome").as_deref(),
        Some("delivered")
    );
    assert_eq!(
        attr(&by_name["detect"], "watch_id"),
        Some(w.watch.to_string())
    );
    // Kinds (OTLP: 2 server, 3 client, 4 producer, 5 consumer) and the semantic conventions'
    // attributes, numbers as numbers.
    for (name, kind) in [
        ("detect", 4),
        ("ingest", 5),
        ("recheck", 4),
        ("push", 3),
        ("result", 5),
    ] {
        assert_eq!(by_name[name]["kind"], serde_json::json!(kind), "{name}");
        assert_eq!(
            attr(&by_name[name], "messaging.system").as_deref(),
            Some("nats"),
            "{name}"
        );
    }
    // The re-check's re-fetch of the item from the catalog: an HTTP CLIENT span.
    let fetch = &by_name["fetch"];
    assert_eq!(fetch["kind"], serde_json::json!(3), "{fetch}");
    assert_eq!(attr(fetch, "item").as_deref(), Some("SKU-1"));
    assert_eq!(attr(fetch, "outcome").as_deref(), Some("ok"));
    assert_eq!(attr(fetch, "server.address").as_deref(), Some("127.0.0.1"));
    assert_ne!(fetch["status"]["code"], serde_json::json!(2), "{fetch}");
    let enqueue = s.subjects.subject(StreamKind::Enqueue, Channel::WebPush);
    for name in ["detect", "ingest"] {
        assert_eq!(
            attr(&by_name[name], "messaging.destination.name").as_deref(),
            Some(enqueue.as_str())
        );
        assert!(
            attr(&by_name[name], "messaging.message.id").is_some(),
            "{name}"
        );
    }
    let push = &by_name["push"];
    assert_eq!(int_attr(push, "http.response.status_code"), Some(201));
    assert_eq!(int_attr(push, "attempt"), Some(1));
    assert_eq!(int_attr(&by_name["result"], "attempt"), Some(1));
    assert_eq!(attr(push, "server.address").as_deref(), Some("127.0.0.1"));
    assert_eq!(
        int_attr(&by_name["result"], "http.response.status_code"),
        Some(201)
    );
    // A delivered push is not an error (OTLP status code 2 is ERROR).
    assert_ne!(push["status"]["code"], serde_json::json!(2), "{push}");

    // The api continues a client's trace with a server span.
    let (client_trace, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let answer = reqwest::Client::new()
        .get(format!("{}/v1/vapid-public-key", p.url("api")))
        .header("traceparent", format!("00-{client_trace}-{client_span}-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let started = Instant::now();
    let server = loop {
        let found = spans
            .lock()
            .unwrap()
            .iter()
            .find(|sp| sp["traceId"] == client_trace)
            .cloned();
        if let Some(span) = found {
            break span;
        }
        poll_wait(started, 10, || "no api span in the client's trace".into()).await;
    };
    assert_eq!(server["parentSpanId"], client_span, "{server}");
    assert_eq!(server["kind"], serde_json::json!(2), "{server}");
    assert_eq!(server["name"], "GET /v1/vapid-public-key", "{server}");
    assert_eq!(int_attr(&server, "http.response.status_code"), Some(200));

    // The latency histograms point at these traces (OpenMetrics exemplars), in text the
    // Prometheus project's parser accepts.
    for (service, family, trace) in [
        (
            "dispatcher",
            "tidings_detection_to_delivery_seconds",
            trace.as_str(),
        ),
        ("pusher", "tidings_push_duration_seconds", trace.as_str()),
        ("api", "tidings_http_request_duration_seconds", client_trace),
    ] {
        let text = metrics(&p, service).await;
        parse_metrics(&text);
        assert!(
            exemplar_traces(&text, family).contains(&trace.to_owned()),
            "{family} has no exemplar of trace {trace}:\n{text}"
        );
    }

    p.stop().await;
    s.cleanup().await;
}

/// With the prod overlay's kind of sampler at ratio 0, a stranger's `traceparent` that asks for
/// sampling continues no exported trace, while an operator's on the ops port is followed.
#[tokio::test]
async fn a_public_traceparent_continues_a_trace_but_cannot_force_its_sampling() {
    let s = Scenario::new().await;
    let sampler = [
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0"),
    ];
    let (p, spans) = traced_pipeline_with(&s, &sampler).await;
    let (stranger, operator) = (
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "5c0a03a688c44eb7b40d3a1e2f3b4c5d",
    );
    let http = reqwest::Client::new();
    let answer = http
        .get(format!("{}/v1/vapid-public-key", p.url("api")))
        .header("traceparent", format!("00-{stranger}-00f067aa0ba902b7-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let answer = http
        .get(format!("{}/v1/admin/clients", p.ops_url("api")))
        .bearer_auth(ADMIN_TOKEN)
        .header("traceparent", format!("00-{operator}-00f067aa0ba902b7-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let traced = |trace: &str| {
        spans
            .lock()
            .unwrap()
            .iter()
            .any(|sp| sp["traceId"] == trace)
    };
    let started = Instant::now();
    while !traced(operator) {
        poll_wait(started, 10, || {
            "the operator's trace was not followed".into()
        })
        .await;
    }
    // The stranger's request ended first, in the same exporter: had it been kept, it would be
    // here by now; a further export period makes sure.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!traced(stranger), "a stranger's sampled flag was obeyed");
    p.stop().await;
    s.cleanup().await;
}

/// With PushRequests batched (`TIDINGS_DISPATCH_PUSH_BATCH`), the requests of one claim share a
/// push-stream message, whose one header cannot carry their traces: each request carries its own,
/// and each notification is still one trace, its push a child of its own re-check.
#[tokio::test]
async fn notifications_pushed_in_one_batch_are_each_one_trace() {
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let (p, spans) = traced_pipeline_with(&s, &[("TIDINGS_DISPATCH_PUSH_BATCH", "10")]).await;
    let (a, sub_a) = watch_sku1_subscribed_to(&s, &push).await;
    let (b, sub_b) = watch_sku1_subscribed_to(&s, &push).await;
    s.catalog.set_price("SKU-1", 1000);

    let started = Instant::now();
    let mut ids = Vec::new();
    for w in [&a, &b] {
        let id = loop {
            let rows = s.rows(w.watch).await;
            let sent = (rows.iter())
                .find(|r| r.notification.status == Status::Sent)
                .map(|r| r.notification.id.0);
            if let Some(id) = sent {
                break id;
            }
            poll_wait(started, 30, || {
                format!("not sent; dispatcher log:\n{}", p.log("dispatcher"))
            })
            .await;
        };
        ids.push(id.to_string());
    }
    for sub in [&sub_a, &sub_b] {
        assert_eq!(
            push.received_by(sub).len(),
            1,
            "each device got its push once"
        );
    }
    let names = ["recheck", "push", "result"];
    let mut traces = HashSet::new();
    for id in &ids {
        let of_row = loop {
            let got: HashMap<String, Value> = spans
                .lock()
                .unwrap()
                .iter()
                .filter(|sp| attr(sp, "outbox_id").as_deref() == Some(id.as_str()))
                .filter_map(|sp| Some((sp["name"].as_str()?.to_owned(), sp.clone())))
                .collect();
            if names.iter().all(|n| got.contains_key(*n)) {
                break got;
            }
            poll_wait(started, 30, || {
                format!("spans of {id} so far: {:?}", got.keys().collect::<Vec<_>>())
            })
            .await;
        };
        let trace = of_row["recheck"]["traceId"].as_str().unwrap().to_owned();
        for n in names {
            assert_eq!(
                of_row[n]["traceId"].as_str(),
                Some(trace.as_str()),
                "{n} of {id}"
            );
        }
        assert_eq!(
            of_row["push"]["parentSpanId"], of_row["recheck"]["spanId"],
            "{id}"
        );
        assert_eq!(
            of_row["result"]["parentSpanId"], of_row["push"]["spanId"],
            "{id}"
        );
        traces.insert(trace);
    }
    assert_eq!(traces.len(), 2, "two notifications, two traces");

    p.stop().await;
    s.cleanup().await;
}

/// The trace ids of the exemplars on `family`'s buckets.
fn exemplar_traces(text: &str, family: &str) -> Vec<String> {
    let bucket = format!("{family}_bucket{{");
    text.lines()
        .filter(|l| l.starts_with(&bucket))
        .filter_map(|l| {
            let (_, exemplar) = l.split_once(" # {trace_id=\"")?;
            Some(exemplar.split('"').next()?.to_owned())
        })
        .collect()
}

/// A push the push service fails (500) and its retry stay in the notification's trace: two
/// re-checks under the one ingest, a first push span with status ERROR and the 500, then the
/// delivered one.
#[tokio::test]
async fn a_retried_notification_is_one_trace_with_a_failed_push_then_a_delivered_one() {
    let Traced {
        s,
        push,
        p,
        spans,
        w,
        sub,
    } = traced().await;
    push.answer_next(&sub, &[Answer::ServerError]);
    s.catalog.set_price("SKU-1", 1000);
    let started = Instant::now();
    let (pushes, rechecks, ingest, detect) = loop {
        let got = spans.lock().unwrap().clone();
        let named = |name: &str| -> Vec<Value> {
            let mut v: Vec<Value> = got
                .iter()
                .filter(|sp| sp["name"] == name)
                .cloned()
                .collect();
            v.sort_by_key(|sp| sp["startTimeUnixNano"].as_str().unwrap_or("").to_owned());
            v
        };
        let (pushes, rechecks) = (named("push"), named("recheck"));
        let delivered = pushes
            .iter()
            .any(|sp| attr(sp, "outcome").as_deref() == Some("delivered"));
        if delivered && rechecks.len() >= 2 {
            let one = |name: &str| named(name).first().cloned().expect(name);
            break (pushes, rechecks, one("ingest"), one("detect"));
        }
        poll_wait(started, 30, || {
            format!(
                "{} push spans so far\n{}",
                pushes.len(),
                p.log("dispatcher")
            )
        })
        .await;
    };
    assert_eq!(pushes.len(), 2, "{pushes:?}");
    let trace = detect["traceId"].as_str().unwrap();
    for sp in pushes.iter().chain(&rechecks).chain([&ingest]) {
        assert_eq!(sp["traceId"], trace, "{sp}");
    }
    for recheck in &rechecks {
        assert_eq!(recheck["parentSpanId"], ingest["spanId"], "{recheck}");
    }
    // (attempt, HTTP status, ERROR status): the failed attempt, then the delivered one.
    for (push, (attempt, http, error)) in pushes.iter().zip([(1, 500, true), (2, 201, false)]) {
        assert_eq!(int_attr(push, "attempt"), Some(attempt), "{push}");
        assert_eq!(
            int_attr(push, "http.response.status_code"),
            Some(http),
            "{push}"
        );
        assert_eq!(
            push["status"]["code"] == serde_json::json!(2),
            error,
            "{push}"
        );
    }
    assert_eq!(attr(&pushes[0], "outcome").as_deref(), Some("transient"));
    let rows = s.rows(w.watch).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].notification.status, Status::Sent);
    p.stop().await;
    s.cleanup().await;
}

/// A catalog that fails the re-check's re-fetch: the `fetch` span under the re-check has status
/// ERROR with the source's error, and the row waits to be tried again.
#[tokio::test]
async fn a_catalog_error_at_recheck_is_an_error_fetch_span() {
    let Traced {
        s,
        push: _push,
        p,
        spans,
        w,
        sub: _sub,
    } = traced().await;
    s.catalog.set_behavior("SKU-1", Behavior::ServerError);
    let request = s.detection(&w, 1000, chrono::Utc::now());
    s.publish_enqueue_traced(&request, &request.dedup_key().to_string(), None)
        .await;
    let started = Instant::now();
    let (fetch, recheck) = loop {
        let got = spans.lock().unwrap().clone();
        let fetch = got.iter().find(|sp| sp["name"] == "fetch").cloned();
        let recheck = got.iter().find(|sp| sp["name"] == "recheck").cloned();
        if let (Some(f), Some(r)) = (fetch, recheck) {
            break (f, r);
        }
        poll_wait(started, 20, || p.log("dispatcher")).await;
    };
    assert_eq!(fetch["parentSpanId"], recheck["spanId"], "{fetch}");
    assert_eq!(fetch["kind"], serde_json::json!(3), "{fetch}");
    assert_eq!(fetch["status"]["code"], serde_json::json!(2), "{fetch}");
    assert_eq!(
        attr(&fetch, "outcome").as_deref(),
        Some("unavailable"),
        "{fetch}"
    );
    let message = fetch["status"]["message"].as_str().unwrap_or("");
    assert!(message.starts_with("unavailable"), "{fetch}");
    let row = s.rows(w.watch).await.into_iter().next().expect("the row");
    assert_eq!(row.notification.status, Status::Retry, "{row:?}");
    p.stop().await;
    s.cleanup().await;
}

/// An outbox write that fails marks its ingest span ERROR with what failed; the message comes
/// back (nak) and its next ingest, once the write succeeds, carries the notification on in the
/// same trace.
#[tokio::test]
async fn a_failed_outbox_write_is_an_error_span_and_the_redelivery_carries_on() {
    let Traced {
        s,
        push: _push,
        p,
        spans,
        w,
        sub: _sub,
    } = traced().await;
    // Every new row is refused until the constraint goes.
    sqlx::query("ALTER TABLE outbox ADD CONSTRAINT refused_by_the_test CHECK (false) NOT VALID")
        .execute(&s.db.pool)
        .await
        .unwrap();
    s.catalog.set_price("SKU-1", 1000);
    let ingests = |got: &[Value]| -> Vec<Value> {
        let mut v: Vec<Value> = got
            .iter()
            .filter(|sp| sp["name"] == "ingest")
            .cloned()
            .collect();
        v.sort_by_key(|sp| sp["startTimeUnixNano"].as_str().unwrap_or("").to_owned());
        v
    };
    let started = Instant::now();
    let failed = loop {
        let got = spans.lock().unwrap().clone();
        if let Some(sp) = ingests(&got).first() {
            break sp.clone();
        }
        poll_wait(started, 20, || p.log("dispatcher")).await;
    };
    assert_eq!(failed["status"]["code"], 2, "{failed}");
    let message = failed["status"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("inserting outbox rows failed") && message.contains("refused_by_the_test"),
        "{failed}"
    );
    assert!(s.rows(w.watch).await.is_empty());
    sqlx::query("ALTER TABLE outbox DROP CONSTRAINT refused_by_the_test")
        .execute(&s.db.pool)
        .await
        .unwrap();
    let started = Instant::now();
    let (ingested, recheck) = loop {
        let got = spans.lock().unwrap().clone();
        let ok = ingests(&got)
            .into_iter()
            .find(|sp| sp["status"]["code"] != 2);
        let recheck = got.iter().find(|sp| sp["name"] == "recheck").cloned();
        if let (Some(ok), Some(recheck)) = (ok, recheck) {
            break (ok, recheck);
        }
        poll_wait(started, 30, || p.log("dispatcher")).await;
    };
    assert_eq!(ingested["traceId"], failed["traceId"], "{ingested}");
    assert_eq!(recheck["parentSpanId"], ingested["spanId"], "{recheck}");
    assert_ne!(recheck["status"]["code"], 2, "{recheck}");
    let started = Instant::now();
    while s
        .rows(w.watch)
        .await
        .first()
        .map(|r| r.notification.status.as_str())
        != Some("sent")
    {
        poll_wait(started, 30, || p.log("dispatcher")).await;
    }
    p.stop().await;
    s.cleanup().await;
}

/// A withheld notification is one trace from the detection (ingest consumes it, the re-check
/// drops it); replaying it starts a trace at the operator's request, linked to the original,
/// which the re-check, the push and the result continue.
#[tokio::test]
async fn a_withheld_notification_and_its_replay_are_linked_traces() {
    // `_push` keeps the fake push service running to the end.
    let Traced {
        s,
        push: _push,
        p,
        spans,
        w,
        ..
    } = traced().await;
    // A detection (as a detector would publish it, in a trace of its own) of a price the
    // catalog no longer shows: the re-check withholds it.
    let (detected_trace, detect_span) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let request = s.detection(&w, 1100, chrono::Utc::now());
    let traceparent = format!("00-{detected_trace}-{detect_span}-01");
    s.publish_enqueue_traced(
        &request,
        &request.dedup_key().to_string(),
        Some(&traceparent),
    )
    .await;
    let started = Instant::now();
    let withheld = loop {
        let found = s.rows(w.watch).await.into_iter().next();
        if let Some(row) = &found
            && row.notification.status == Status::Dropped
        {
            assert_eq!(
                row.notification.reason.map(|r| r.as_str()),
                Some("condition_lost")
            );
            break row.notification.id.0;
        }
        poll_wait(started, 20, || {
            format!("row {found:?}\n{}", p.log("dispatcher"))
        })
        .await;
    };
    let span_of = |name: &str, outbox_id: Option<uuid::Uuid>| {
        spans
            .lock()
            .unwrap()
            .iter()
            .find(|sp| {
                sp["name"] == name
                    && outbox_id.is_none_or(|id| attr(sp, "outbox_id") == Some(id.to_string()))
            })
            .cloned()
    };
    let started = Instant::now();
    let (ingest, recheck) = loop {
        if let (Some(i), Some(r)) = (span_of("ingest", None), span_of("recheck", Some(withheld))) {
            break (i, r);
        }
        poll_wait(started, 10, || "no ingest and recheck spans".into()).await;
    };
    assert_eq!(ingest["traceId"], detected_trace);
    assert_eq!(ingest["parentSpanId"], detect_span);
    assert_eq!(recheck["traceId"], detected_trace);
    assert_eq!(recheck["parentSpanId"], ingest["spanId"]);
    assert_eq!(attr(&recheck, "outcome").as_deref(), Some("dropped"));
    assert_eq!(attr(&recheck, "reason").as_deref(), Some("condition_lost"));

    // The price is down now: the replay is sent.
    s.catalog.set_price("SKU-1", 1000);
    let replayed = reqwest::Client::new()
        .post(format!(
            "{}/v1/admin/outbox/{withheld}/replay",
            p.ops_url("api")
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(replayed.status(), 201);
    let replay: uuid::Uuid = replayed.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let started = Instant::now();
    let (operator, recheck, pushed) = loop {
        let operator = span_of("POST /v1/admin/outbox/{id}/replay", None);
        if let (Some(o), Some(r), Some(p)) = (
            operator,
            span_of("recheck", Some(replay)),
            span_of("push", Some(replay)),
        ) {
            break (o, r, p);
        }
        poll_wait(started, 20, || {
            format!("replay spans missing\n{}", p.log("dispatcher"))
        })
        .await;
    };
    assert_eq!(operator["kind"], serde_json::json!(2));
    let trace = operator["traceId"].as_str().unwrap();
    assert_ne!(trace, detected_trace, "the replay is a trace of its own");
    let links = operator["links"].as_array().cloned().unwrap_or_default();
    assert!(
        links
            .iter()
            .any(|l| l["traceId"] == detected_trace && l["spanId"] == ingest["spanId"]),
        "the operator's request links to the replayed notification: {links:?}"
    );
    assert_eq!(recheck["traceId"], trace);
    assert_eq!(recheck["parentSpanId"], operator["spanId"]);
    assert_eq!(pushed["traceId"], trace);
    assert_eq!(attr(&pushed, "outcome").as_deref(), Some("delivered"));
    p.stop().await;
    s.cleanup().await;
}

#[tokio::test]
async fn sigterm_during_a_burst_loses_nothing_and_delivers_nothing_twice() {
    const N: usize = 1000;
    let s = Scenario::new().await;
    let push = FakePushService::start().await.unwrap();
    let sub = push.subscription();
    let mut p = Pipeline::start(&s, &[("TIDINGS_SCAN_INTERVAL", "1s")]).await;

    fixtures::crowd(&s.db.pool, "SKU-1", &sub, N).await.unwrap();
    s.catalog.set_price("SKU-1", 1000);

    // Mid-burst: some sent, not all.
    p.wait_for_rows(&s, &[Status::Sent], 50, 60).await;
    for name in ["detector", "dispatcher", "pusher"] {
        let status = p.terminate(name, Duration::from_secs(20)).await;
        assert!(
            status.success(),
            "{name} exited with {status}:\n{}",
            p.log(name)
        );
    }
    let sent_at_stop = s.db.rows_in(&[Status::Sent]).await;
    eprintln!("sent when stopped: {sent_at_stop} of {N}");
    assert!(
        sent_at_stop < N as i64,
        "the burst was over before SIGTERM; the test proves nothing"
    );

    for name in ["detector", "dispatcher", "pusher"] {
        p.spawn(name);
    }
    for name in ["detector", "dispatcher", "pusher"] {
        p.wait_ready(name).await;
    }
    let terminal = [Status::Sent, Status::Dropped, Status::Failed];
    p.wait_for_rows(&s, &terminal, N as i64, 120).await;
    assert_eq!(
        s.db.count("SELECT count(*) FROM outbox").await,
        N as i64,
        "one row per watch"
    );
    assert_eq!(s.db.rows_in(&[Status::Sent]).await, N as i64);
    let received = push.received();
    let rows: HashSet<Option<String>> = received.iter().map(|r| r.notification_id()).collect();
    assert_eq!(
        received.len(),
        N,
        "every notification delivered exactly once"
    );
    assert_eq!(rows.len(), N, "no outbox row delivered twice");
    p.stop().await;
    s.cleanup().await;
}

async fn readyz(p: &Pipeline, name: &str) -> (u16, String) {
    let r = reqwest::get(format!("{}/readyz", p.url(name)))
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn services_started_before_nats_wait_unready_and_start_when_it_comes() {
    let s = Scenario::new().await;
    let mut nats = PrivateNats::reserve().unwrap();
    let mut p = Pipeline::start_only(&s, &[], &[("NATS_URL", &nats.url)]).await;
    for name in ["dispatcher", "pusher", "detector"] {
        p.spawn(name);
    }
    // Up, saying what they wait for, and not exiting.
    let started = Instant::now();
    for name in ["dispatcher", "pusher", "detector"] {
        loop {
            if let Ok(r) = reqwest::get(format!("{}/livez", p.url(name))).await
                && r.status().is_success()
            {
                break;
            }
            poll_wait(started, 20, || {
                format!("{name} never served /livez:\n{}", p.log(name))
            })
            .await;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["dispatcher", "pusher", "detector"] {
        let (status, why) = readyz(&p, name).await;
        assert_eq!(status, 503, "{name}: {why}");
        assert!(
            why.contains("starting") && (why.contains("NATS") || why.contains("JetStream")),
            "{name}: {why}"
        );
        assert!(
            p.log(name).contains("not available yet; retrying"),
            "{}",
            p.log(name)
        );
    }

    // NATS comes: each becomes ready without a restart.
    nats.start().await.unwrap();
    for name in ["dispatcher", "pusher", "detector"] {
        p.wait_ready(name).await;
    }
    p.stop().await;
}

#[tokio::test]
async fn a_service_without_postgres_stays_up_and_says_so() {
    let s = Scenario::new().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("postgres://tidings@127.0.0.1:{port}/tidings");
    let mut p = Pipeline::start_only(&s, &[], &[("DATABASE_URL", &url)]).await;
    p.spawn("dispatcher");
    p.spawn("api");
    let started = Instant::now();
    loop {
        let d = reqwest::get(format!("{}/readyz", p.url("dispatcher"))).await;
        let a = reqwest::get(format!("{}/readyz", p.url("api"))).await;
        if let (Ok(d), Ok(a)) = (d, a) {
            assert_eq!(d.status(), 503);
            assert_eq!(a.status(), 503);
            assert!(d.text().await.unwrap().contains("Postgres"));
            break;
        }
        poll_wait(started, 20, || {
            format!("not serving:\n{}", p.log("dispatcher"))
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (status, _) = readyz(&p, "dispatcher").await;
    assert_eq!(status, 503, "still waiting, still running");
    for name in ["dispatcher", "api"] {
        let text = metrics(&p, name).await;
        assert!(text.contains("\ntidings_ready 0\n"), "{name}:\n{text}");
    }
    p.stop().await;
}

async fn register(p: &Pipeline, sub: &Subscription) -> reqwest::Response {
    let subscription = serde_json::json!({"endpoint": sub.endpoint,
        "keys": {"p256dh": sub.p256dh, "auth": sub.auth}});
    reqwest::Client::new()
        .post(format!("{}/v1/devices", p.url("api")))
        .json(&serde_json::json!({"subscription": subscription, "time_zone": "UTC"}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn against_an_empty_database_every_service_is_unready_until_migrate_has_run() {
    let s = Scenario::new().await;
    let sub = FakePushService::start().await.unwrap().subscription();
    let empty = TestDb::empty().await.unwrap();
    let mut p = Pipeline::start_only(&s, &[], &[("DATABASE_URL", &empty.url)]).await;
    for name in ["api", "dispatcher", "detector"] {
        p.spawn(name);
    }
    // Each answers, unready, and says what to do on the port the kubelet probes; the api's
    // public port only that it is not ready.
    for name in ["api", "dispatcher", "detector"] {
        let started = Instant::now();
        loop {
            if let Ok(r) = reqwest::get(format!("{}/readyz", p.ops_url(name))).await {
                assert_eq!(r.status(), 503, "{name}");
                let body = r.text().await.unwrap();
                if body.contains("run `tidings-api migrate`") {
                    break;
                }
            }
            poll_wait(started, 20, || format!("{name}:\n{}", p.log(name))).await;
        }
    }
    let public = reqwest::get(format!("{}/readyz", p.url("api")))
        .await
        .unwrap();
    assert_eq!(public.status(), 503);
    let body = public.text().await.unwrap();
    assert!(
        !body.contains("migrat"),
        "the public /readyz gives no reason: {body}"
    );
    // The api's routes answer 503 with a problem, not 500 on a missing table.
    let r = register(&p, &sub).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(r.headers()["retry-after"], "5");
    // Nothing of the database's own words reaches a stranger (regression: the raw schema error).
    let problem: Value = r.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with("not ready")
            && !detail.contains("migrat")
            && !detail.contains("relation"),
        "{problem}"
    );

    let migrated = Instant::now();
    tidings_tests::harness::succeeds(
        std::process::Command::new(binary("api"))
            .arg("migrate")
            .env("DATABASE_URL", &empty.url),
        "tidings-api migrate",
    );
    for name in ["api", "dispatcher", "detector"] {
        p.wait_ready(name).await;
    }
    let took = migrated.elapsed();
    eprintln!("every service ready {took:?} after `tidings-api migrate` started");
    assert!(
        took < Duration::from_secs(10),
        "ready {took:?} after migrate"
    );
    let r = register(&p, &sub).await;
    assert_eq!(r.status(), 201, "served once migrated");
    p.stop().await;
}

/// On a server configured as `tidings_bus::permissions` says for one prefix, every service does
/// its part as its own NATS user, and none may publish another's messages: the pusher cannot
/// publish an enqueue request, the detector cannot publish a push request.
#[tokio::test]
async fn each_service_works_as_its_own_nats_user_and_cannot_publish_the_others_messages() {
    let s = Scenario::new().await;
    let stack = harness::stack().unwrap();
    let password = |service: Service| {
        let (_, pw) = stack
            .nats_passwords
            .iter()
            .find(|(name, _)| name == service.name())
            .expect("the stack gives each service a NATS password");
        format!("\"{pw}\"")
    };
    let passwords: Vec<(Service, String)> =
        Service::ALL.iter().map(|s| (*s, password(*s))).collect();
    let users: Vec<(Service, &str, &str)> = passwords
        .iter()
        .map(|(service, pw)| (*service, service.name(), pw.as_str()))
        .collect();
    let config = server_config(
        s.subjects.prefix(),
        &users,
        Some(("admin", "\"admin-of-this-test\"")),
    );
    let nats = PrivateNats::with_config(&config).await.unwrap();
    let push = FakePushService::start().await.unwrap();
    let p = Pipeline::start(&s, &[("NATS_URL", &nats.url)]).await;
    let w = watch_sku1_pushing_to(&s, &push).await;
    let started = Instant::now();
    loop {
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM outbox WHERE watch_id = $1")
                .bind(w.watch)
                .fetch_optional(&s.db.pool)
                .await
                .unwrap();
        if status.as_deref() == Some("sent") {
            break;
        }
        poll_wait(started, 30, || {
            format!(
                "row {status:?}\ndetector:\n{}\ndispatcher:\n{}\npusher:\n{}",
                p.log("detector"),
                p.log("dispatcher"),
                p.log("pusher")
            )
        })
        .await;
    }
    assert_eq!(push.received().len(), 1, "one push delivered");

    // What a stream has ever stored (the dispatcher purges what it has ingested).
    let admin = async_nats::jetstream::new(nats.client().await.unwrap());
    let last = |kind: StreamKind| {
        let (admin, name) = (admin.clone(), s.subjects.stream(kind));
        async move {
            let mut stream = admin.get_stream(name).await.unwrap();
            stream.info().await.unwrap().state.last_sequence
        }
    };
    let (enqueued, pushes) = (
        last(StreamKind::Enqueue).await,
        last(StreamKind::Push).await,
    );
    assert!(enqueued >= 1 && pushes >= 1, "the pipeline published");
    let as_user = |service: Service| {
        let (_, pw) = passwords.iter().find(|(s, _)| *s == service).unwrap();
        let pw = pw.trim_matches('"').to_owned();
        let url = nats.url.clone();
        async move {
            let client =
                async_nats::ConnectOptions::with_user_and_password(service.name().to_owned(), pw)
                    .custom_inbox_prefix(format!("_INBOX_{}", service.name()))
                    .connect(url.as_str())
                    .await
                    .unwrap();
            let mut js = async_nats::jetstream::new(client);
            js.set_timeout(Duration::from_secs(2));
            js
        }
    };
    for (service, kind) in [
        (Service::Pusher, StreamKind::Enqueue),
        (Service::Detector, StreamKind::Push),
    ] {
        let js = as_user(service).await;
        let refused = match js
            .publish(s.subjects.subject(kind, Channel::WebPush), "forged".into())
            .await
        {
            Ok(ack) => ack.await.is_err(),
            Err(_) => true,
        };
        assert!(refused, "{service:?} published a {kind:?} message");
    }
    assert_eq!(last(StreamKind::Enqueue).await, enqueued);
    assert_eq!(last(StreamKind::Push).await, pushes);
    // The detector reads how much waits for ingest (its scans wait while dispatch is behind), and
    // no other consumer.
    let detector = as_user(Service::Detector).await;
    let info = |stream: StreamKind, consumer: &'static str| {
        let (js, name) = (detector.clone(), s.subjects.stream(stream));
        async move {
            js.get_consumer_from_stream::<async_nats::jetstream::consumer::pull::Config, _, _>(
                consumer, name,
            )
            .await
            .is_ok()
        }
    };
    assert!(info(StreamKind::Enqueue, "dispatcher-ingest").await);
    assert!(!info(StreamKind::Push, "pusher").await);
    let log = p.log("detector");
    assert!(!log.contains("cannot read the enqueue backlog"), "{log}");
    refusals(&s, &last, &as_user).await;
}

/// What the services' users may NOT do, tried as each: the api forges no result or enqueue
/// request, the pusher cannot shorten the delivery log's memory (the guard against a second
/// push) or make a stream, and nobody but the dispatcher creates one.
async fn refusals<L, LF, U, UF>(s: &Scenario, last: &L, as_user: &U)
where
    L: Fn(StreamKind) -> LF,
    LF: std::future::Future<Output = u64>,
    U: Fn(Service) -> UF,
    UF: std::future::Future<Output = async_nats::jetstream::Context>,
{
    let refused = |r: Result<async_nats::jetstream::context::PublishAckFuture, _>| async move {
        match r {
            Ok(ack) => ack.await.is_err(),
            Err(_) => true,
        }
    };
    let api = as_user(Service::Api).await;
    for kind in [StreamKind::Result, StreamKind::Enqueue] {
        let before = last(kind).await;
        let subject = s.subjects.subject(kind, Channel::WebPush);
        assert!(
            refused(api.publish(subject, "forged".into()).await).await,
            "the api published a {kind:?} message"
        );
        assert_eq!(last(kind).await, before);
    }
    let pusher = as_user(Service::Pusher).await;
    let bucket = s.subjects.bucket(tidings_bus::delivered::BUCKET);
    let kv_stream = format!("KV_{bucket}");
    let admin_view = pusher.get_stream(&kv_stream).await;
    let mut shortened = admin_view
        .expect("the pusher may look at the delivery log's stream")
        .cached_info()
        .config
        .clone();
    let max_age = shortened.max_age;
    shortened.max_age = Duration::from_secs(1);
    assert!(
        pusher.update_stream(shortened).await.is_err(),
        "the pusher shortened the delivery log's memory"
    );
    assert!(
        pusher.delete_key_value(&bucket).await.is_err(),
        "the pusher deleted the delivery log"
    );
    let dispatcher = as_user(Service::Dispatcher).await;
    let mut stream = dispatcher.get_stream(&kv_stream).await.unwrap();
    assert_eq!(stream.info().await.unwrap().config.max_age, max_age);
    for service in [Service::Pusher, Service::Api, Service::Detector] {
        let js = as_user(service).await;
        let made = js
            .create_stream(async_nats::jetstream::stream::Config {
                name: format!("{}_sneaky", s.subjects.prefix()),
                subjects: vec![format!("{}.sneaky.>", s.subjects.prefix())],
                ..Default::default()
            })
            .await;
        assert!(made.is_err(), "{service:?} created a stream");
    }
}

/// A pipeline leaves no files behind once stopped or dropped, and keeps its services' logs when
/// the test holding it fails (a run used to leave a log folder for every pipeline only dropped).
#[tokio::test]
async fn a_pipeline_removes_its_files_unless_its_test_failed() {
    let s = Scenario::new().await;
    let stopped = Pipeline::start_only(&s, &[], &[]).await;
    let stopped_logs = stopped.logs().to_owned();
    assert!(stopped_logs.join("ca.pem").exists());
    stopped.stop().await;
    assert!(!stopped_logs.exists(), "stop() left {stopped_logs:?}");

    let dropped = Pipeline::start_only(&s, &[], &[]).await;
    let dropped_logs = dropped.logs().to_owned();
    drop(dropped);
    assert!(!dropped_logs.exists(), "drop left {dropped_logs:?}");

    let failed = Pipeline::start_only(&s, &[], &[]).await;
    let failed_logs = failed.logs().to_owned();
    let outcome = tokio::spawn(async move {
        let _held = failed;
        panic!("a failing test");
    })
    .await;
    assert!(outcome.is_err_and(|e| e.is_panic()));
    let kept = failed_logs.join("sources.json").exists();
    let _ = std::fs::remove_dir_all(&failed_logs);
    assert!(kept, "a failed test's pipeline removed {failed_logs:?}");
}
