//! Email, the third channel, through the real services and a real SMTP server (aiosmtpd, run by
//! the test): an address is confirmed before anything else is mailed to it; the mail is
//! re-checked, DKIM-signed (verified by PyPI's `dkimpy`, not our code) and names its outbox
//! row; its link shows the value now ("still true", then "ended" once the price recovered); its
//! one-click unsubscribe (RFC 8058) stops the mail. Then each answer a relay gives: 4xx then
//! 250 (retried, sent once), a 5xx to RCPT (the device deactivated, `mailbox_rejected`), an
//! address refused at registration (nothing registered), and the per-address limit. The pages
//! speak the reader's language.

use serde_json::{Value, json};
use std::time::Duration;
use tidings_api_types::doctor::Diagnosis;
use tidings_domain::outbox::{DropReason, Reason, Status};
use tidings_domain::subscription::Deactivation;
use tidings_domain::{DeviceId, WatchId};
use tidings_email::dkim::DkimKey;
use tidings_tests::fake_smtp::{FakeSmtp, SmtpOptions};
use tidings_tests::mail::{self, Read};
use tidings_tests::scenario::Scenario;
use tidings_tests::services::{ADMIN_TOKEN, Pipeline, call, watch_below};
use tidings_tests::temp_file::TempFile;

const FROM: &str = "Tidings <alerts@tidings.test>";
const SELECTOR: &str = "mail2026";

/// The files the services read a mailing key and the bounce secrets from, removed after the test.
struct MailFiles {
    key: TempFile,
    bounce: TempFile,
}

/// A new Ed25519 DKIM key for `tidings.test`, written where the dispatcher and api read it.
fn dkim_key() -> (MailFiles, DkimKey) {
    let pem = tidings_email::dkim::generate_ed25519_pem().unwrap();
    let files = MailFiles {
        key: TempFile::new("tidings-dkim", "pem", pem.as_bytes()).unwrap(),
        bounce: TempFile::new("tidings-dkim", "bounce", BOUNCE_SECRET.as_bytes()).unwrap(),
    };
    let key = DkimKey::from_pem(pem.as_bytes(), "tidings.test", SELECTOR).unwrap();
    (files, key)
}

/// What signs the test's bounce reports.
const BOUNCE_SECRET: &str = "whsec_dGlkaW5ncy1lbWFpbC1ib3VuY2Utc2VjcmV0LTI2";

async fn mailing_pipeline(s: &Scenario, smtp: &FakeSmtp, files: &MailFiles) -> Pipeline {
    let port = smtp.port.to_string();
    let (key_file, bounce_file) = (files.key.setting(), files.bounce.setting());
    let env = [
        ("TIDINGS_SMTP_HOST", "127.0.0.1"),
        ("TIDINGS_SMTP_PORT", port.as_str()),
        ("TIDINGS_SMTP_SECURITY", "plain"),
        ("TIDINGS_EMAIL_FROM", FROM),
        ("TIDINGS_DKIM_KEY_FILE", key_file.as_str()),
        ("TIDINGS_DKIM_SELECTOR", SELECTOR),
        ("TIDINGS_EMAIL_UNCONFIRMED_WAIT", "300ms"),
        ("TIDINGS_EMAIL_BOUNCE_SECRETS_FILE", bounce_file.as_str()),
        // The page's check reads the catalog afresh.
        ("TIDINGS_API_CHECK_CACHE", "0s"),
    ];
    Pipeline::start(s, &env).await
}

/// `POST /v1/devices` with `address`: (status, answer).
async fn register(p: &Pipeline, address: &str) -> (u16, Value) {
    let body = json!({"email": address, "time_zone": "Europe/Berlin"});
    call(
        reqwest::Method::POST,
        format!("{}/v1/devices", p.url("api")),
        None,
        Some(body),
    )
    .await
}

/// A watch for a price below 10.00 on `item` (at 12.99 now).
async fn watch(p: &Pipeline, s: &Scenario, token: &str, item: &str) -> WatchId {
    s.catalog.set_price(item, 1299);
    let watch = watch_below(p, token, item, 1000).await;
    assert_eq!(watch["channel"], "email");
    WatchId(watch["id"].as_str().unwrap().parse().unwrap())
}

/// dkimpy's verdict, with `key`'s record as the only DNS it may ask.
fn dkim_verdict(message: &[u8], key: &DkimKey) -> String {
    let (name, record) = key.dns_record();
    mail::dkim_verdict(message, &name, &record).unwrap()
}

fn read(message: &[u8]) -> Read {
    Read::of(message).unwrap()
}

/// The mails to `to`, once there are `n`.
async fn mails_to(smtp: &FakeSmtp, to: &str, n: usize) -> Vec<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got: Vec<Vec<u8>> = (smtp.received().into_iter())
            .filter(|(rcpt, _)| rcpt == to)
            .map(|(_, m)| m)
            .collect();
        if got.len() >= n {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{to} received {} of {n} mails in 30 s",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The page at `url` (GET, or POST with `body`): (status, headers, text).
async fn page(url: &str, post: Option<&str>) -> (u16, reqwest::header::HeaderMap, String) {
    let client = reqwest::Client::new();
    let request = match post {
        Some(body) => client
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.to_owned()),
        None => client.get(url),
    };
    let resp = request.send().await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.text().await.unwrap())
}

/// Registers `address`, and returns its device token and id with the confirmation link mailed
/// to it (the `n`th mail to it).
async fn registered(
    p: &Pipeline,
    smtp: &FakeSmtp,
    key: &DkimKey,
    address: &str,
    n: usize,
) -> (String, DeviceId, String) {
    let (status, created) = register(p, address).await;
    assert_eq!(status, 201, "{created}");
    assert!(created["confirm_by"].is_string(), "{created}");
    let mail = mails_to(smtp, address, n).await.pop().unwrap();
    assert_eq!(dkim_verdict(&mail, key), "verified");
    let read = read(&mail);
    assert_eq!(
        read.header("subject"),
        Some("Confirm your Tidings notifications")
    );
    let link = read
        .link(&format!("{}/v1/email/confirm?t=", p.url("api")))
        .unwrap();
    let device = DeviceId(created["device_id"].as_str().unwrap().parse().unwrap());
    (created["token"].as_str().unwrap().to_owned(), device, link)
}

async fn wait_for_status(
    s: &Scenario,
    watch: WatchId,
    status: Status,
) -> tidings_tests::world::OutboxRow {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(row) = s
            .rows(watch)
            .await
            .into_iter()
            .find(|r| r.notification.status == status)
        {
            return row;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {status} row in 30 s: {:?}",
            s.rows(watch).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn deactivation(s: &Scenario, device: DeviceId) -> Option<Deactivation> {
    let subs = tidings_store::devices::subscriptions(&s.db.pool, device)
        .await
        .unwrap();
    subs[0].deactivation_reason
}

#[tokio::test]
async fn a_confirmed_address_gets_a_signed_rechecked_mail_whose_link_tells_the_truth_until_it_unsubscribes()
 {
    let s = Scenario::new().await;
    let smtp = FakeSmtp::start(&SmtpOptions::default()).unwrap();
    let (key_file, key) = dkim_key();
    let p = mailing_pipeline(&s, &smtp, &key_file).await;
    let api = p.url("api");
    let ann = "ann@tidings.test";

    // Registered, then nothing but the confirmation until its link is opened: the drop waits,
    // pending, and is not counted as sent.
    let (token, device, confirm) = registered(&p, &smtp, &key, ann, 1).await;
    let w = watch(&p, &s, &token, "SKU-E1").await;
    s.catalog.set_price("SKU-E1", 999);
    let waiting = wait_for_status(&s, w, Status::Pending).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        s.row(waiting.notification.id).await.notification.status,
        Status::Pending
    );
    assert_eq!(
        mails_to(&smtp, ann, 1).await.len(),
        1,
        "only the confirmation"
    );

    // The link's GET only asks (mail scanners follow links); the POST confirms, once.
    let (status, headers, asked) = page(&confirm, None).await;
    assert_eq!(status, 200, "{asked}");
    assert!(asked.contains("<form method=\"post\""), "{asked}");
    assert_eq!(headers["referrer-policy"], "no-referrer");
    let (status, _, done) = page(&confirm, Some("")).await;
    assert_eq!((status, done.contains("Confirmed")), (200, true), "{done}");
    let (status, _, again) = page(&confirm, Some("")).await;
    assert_eq!(
        (status, again.contains("used already")),
        (200, true),
        "{again}"
    );
    let forged = format!("{api}/v1/email/confirm?t=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    assert_eq!(page(&forged, Some("")).await.0, 404);
    // Not a token at all (regression: the contract fuzzer's, four-byte characters within the
    // schema's 64 then, answered 400 as a schema-valid request) is a 400 on every link.
    for odd in ["%F0%9D%90%93%F0%9D%90%A1", "a%20b", "a%26b"] {
        assert_eq!(
            page(&format!("{api}/v1/email/confirm?t={odd}"), None)
                .await
                .0,
            400,
            "{odd}"
        );
    }

    // The mail: re-checked, signed, named for its row, with one-click unsubscribe.
    let mail = mails_to(&smtp, ann, 2).await.pop().unwrap();
    let sent = wait_for_status(&s, w, Status::Sent).await;
    assert_eq!(
        sent.notification.id, waiting.notification.id,
        "the row that waited went"
    );
    assert_eq!(dkim_verdict(&mail, &key), "verified");
    let read = read(&mail);
    let id = sent.notification.id;
    assert_eq!(
        read.header("message-id"),
        Some(format!("<{id}@tidings.test>").as_str())
    );
    assert_eq!(read.header("auto-submitted"), Some("auto-generated"));
    assert_eq!(
        read.header("list-unsubscribe-post"),
        Some("List-Unsubscribe=One-Click")
    );
    let subject = read.header("subject").unwrap();
    assert!(
        subject.contains("SKU-E1") && subject.contains("as of"),
        "{subject}"
    );
    assert!(
        read.text.contains("9.99") && read.text.contains("holds until"),
        "{}",
        read.text
    );
    assert_eq!(
        sent.push_message_id.as_deref(),
        Some("2"),
        "the relay's queue id"
    );

    // Its link checks the item when it is opened.
    let check = read.link(&format!("{api}/n/{id}?t=")).unwrap();
    let (status, headers, now) = page(&check, None).await;
    assert_eq!((status, now.contains("Still true")), (200, true), "{now}");
    assert!(
        headers["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("default-src 'none'")
    );
    s.catalog.set_price("SKU-E1", 1500);
    let (status, _, ended) = page(&check, None).await;
    assert_eq!(
        (status, ended.contains("This has ended")),
        (200, true),
        "{ended}"
    );
    let tampered = format!("{}x", &check[..check.len() - 1]);
    assert_eq!(page(&tampered, None).await.0, 404);

    // RFC 8058's one-click POST to the List-Unsubscribe link stops the mail.
    let list = read.header("list-unsubscribe").unwrap();
    let https = list
        .split(['<', '>'])
        .find(|l| l.starts_with("http"))
        .unwrap();
    assert!(list.contains("<mailto:alerts@tidings.test>"), "{list}");
    assert_eq!(deactivation(&s, device).await, None);
    let (status, _, stopped) = page(https, Some("List-Unsubscribe=One-Click")).await;
    assert_eq!(status, 200, "{stopped}");
    assert_eq!(
        deactivation(&s, device).await,
        Some(Deactivation::Unsubscribed)
    );
    // The unsubscribe token unsubscribes only; the page's token cannot.
    let sub = https.split("s=").nth(1).unwrap().split('&').next().unwrap();
    let page_token = check.split("t=").nth(1).unwrap();
    let wrong = format!("{api}/v1/email/unsubscribe?s={sub}&t={page_token}");
    assert_eq!(page(&wrong, Some("")).await.0, 404);

    // `doctor`: the relay answers, and the record that publishes the DKIM key.
    let (status, doctor) = call(
        reqwest::Method::GET,
        format!("{}/v1/admin/doctor", p.ops_url("api")),
        Some(ADMIN_TOKEN),
        None,
    )
    .await;
    assert_eq!(status, 200, "{doctor}");
    let doctor: Diagnosis = serde_json::from_value(doctor).unwrap();
    let find = |name: &str| doctor.checks.iter().find(|c| c.name == name).unwrap();
    assert!(find("email relay").ok, "{doctor:?}");
    let (name, record) = key.dns_record();
    assert!(
        find("dkim")
            .detail
            .contains(&format!("TXT {name} \"{record}\"")),
        "{doctor:?}"
    );
    p.stop().await;
}

#[tokio::test]
async fn each_relay_answer_ends_its_row_as_documented() {
    let s = Scenario::new().await;
    let smtp = FakeSmtp::start(&SmtpOptions::default()).unwrap();
    let (key_file, key) = dkim_key();
    let p = mailing_pipeline(&s, &smtp, &key_file).await;

    // An address the relay refuses is refused at registration, and nothing is registered.
    let (status, refused) = register(&p, "refused-dee@tidings.test").await;
    assert_eq!(status, 422, "{refused}");
    assert!(
        refused["detail"].as_str().unwrap().contains("550"),
        "{refused}"
    );
    // Not an address, or not one mailbox.
    for bad in [
        "dee",
        "Dee <dee@tidings.test>",
        "dee@tidings.test\r\nBcc: x@y.z",
        "dee@[127.0.0.1]",
    ] {
        assert_eq!(register(&p, bad).await.0, 422, "{bad:?}");
    }
    // Confirmation mails to one address: three a day.
    for _ in 0..3 {
        assert_eq!(register(&p, "flood@tidings.test").await.0, 201);
    }
    let (status, limited) = register(&p, "Flood@Tidings.test").await;
    assert_eq!(status, 429, "{limited}");

    // 451, then 250: retried, and mailed once.
    let bo = "defer-second-bo@tidings.test";
    let (token, bo_device, confirm) = registered(&p, &smtp, &key, bo, 1).await;
    assert_eq!(page(&confirm, Some("")).await.0, 200);
    let w = watch(&p, &s, &token, "SKU-E2").await;
    s.catalog.set_price("SKU-E2", 999);
    let sent = wait_for_status(&s, w, Status::Sent).await;
    let attempts = s.attempts(sent.notification.id).await;
    let outcomes: Vec<&str> = attempts.iter().map(|a| a.1.as_str()).collect();
    assert_eq!(outcomes, ["transient", "delivered"], "{attempts:?}");
    assert_eq!(
        mails_to(&smtp, bo, 2).await.len(),
        2,
        "the confirmation and one notification"
    );

    // A provider's bounce report, signed (Standard Webhooks), stops the mail; unsigned, nothing.
    let report = json!({"kind": "permanent", "recipients": ["Defer-Second-Bo@tidings.test"]});
    let body = report.to_string();
    let bounces = format!("{}/v1/email/bounces", p.url("api"));
    let unsigned = reqwest::Client::new()
        .post(&bounces)
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(unsigned.status().as_u16(), 401);
    let secret = tidings_signatures::Secret::parse(BOUNCE_SECRET).unwrap();
    let at = chrono::Utc::now().timestamp();
    let taken = reqwest::Client::new()
        .post(&bounces)
        .header("webhook-id", "msg_bounce_1")
        .header("webhook-timestamp", at.to_string())
        .header(
            "webhook-signature",
            secret.sign("msg_bounce_1", at, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status().as_u16(), 200);
    assert_eq!(
        taken.json::<Value>().await.unwrap(),
        json!({"deactivated": 1})
    );
    assert_eq!(
        deactivation(&s, bo_device).await,
        Some(Deactivation::MailboxRejected)
    );

    // A 5xx to RCPT once confirmed: the row dropped, the device's mail stopped.
    // The one name from outside a mail carries is the item's code: one that could end a header
    // line is refused at the door (the mail's own header encoding is tested with hostile
    // subjects in shared/email).
    for hostile in [
        "SKU\r\nBcc: victim@example.com",
        "SKU\nX: y",
        "SKU\u{2028}X",
    ] {
        let (status, refused) = call(
            reqwest::Method::POST,
            format!("{}/v1/watches", p.url("api")),
            Some(&token),
            Some(json!({"item_code": hostile, "triggers": [{"kind": "price_below", "threshold": 1000}]})),
        )
        .await;
        assert_eq!(status, 422, "{hostile:?}: {refused}");
    }

    let cy = "refuse-later-cy@tidings.test";
    let (token, device, confirm) = registered(&p, &smtp, &key, cy, 1).await;
    assert_eq!(page(&confirm, Some("")).await.0, 200);
    let w = watch(&p, &s, &token, "SKU-E3").await;
    s.catalog.set_price("SKU-E3", 999);
    let dropped = wait_for_status(&s, w, Status::Dropped).await;
    assert_eq!(
        dropped.notification.reason,
        Some(Reason::Dropped(DropReason::SubscriptionGone))
    );
    assert!(
        dropped
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("550"),
        "{dropped:?}"
    );
    assert_eq!(
        deactivation(&s, device).await,
        Some(Deactivation::MailboxRejected)
    );
    p.stop().await;
}

#[tokio::test]
async fn a_digest_is_one_signed_mail_listing_what_still_holds() {
    let s = Scenario::new().await;
    let smtp = FakeSmtp::start(&SmtpOptions::default()).unwrap();
    let (key_file, key) = dkim_key();
    let p = mailing_pipeline(&s, &smtp, &key_file).await;
    let to = "digest-dee@tidings.test";
    let (token, _, confirm) = registered(&p, &smtp, &key, to, 1).await;
    assert_eq!(page(&confirm, Some("")).await.0, 200);
    let (status, me) = call(
        reqwest::Method::PATCH,
        format!("{}/v1/devices/me", p.url("api")),
        Some(&token),
        Some(json!({"preferences": {"digest": "daily at 08:00"}})),
    )
    .await;
    assert_eq!(status, 200, "{me}");
    let items = ["SKU-ED1", "SKU-ED2", "SKU-ED3"];
    let mut watches = Vec::new();
    for item in items {
        watches.push(watch(&p, &s, &token, item).await);
    }
    for item in items {
        s.catalog.set_price(item, 999);
    }
    let held = "SELECT count(*) FROM outbox WHERE held = 'digest' AND status = 'pending'";
    s.db.wait_for_count(held, 3, 15).await;
    // One recovers before 08:00 comes.
    s.catalog.set_price("SKU-ED2", 1299);
    s.db.digest_time().await;
    let sent = [
        wait_for_status(&s, watches[0], Status::Sent).await,
        wait_for_status(&s, watches[2], Status::Sent).await,
    ];
    wait_for_status(&s, watches[1], Status::Dropped).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mails = mails_to(&smtp, to, 2).await;
    assert_eq!(mails.len(), 2, "the confirmation and one digest");
    let digest = &mails[1];
    assert_eq!(dkim_verdict(digest, &key), "verified");
    let read = read(digest);
    let subject = read.header("subject").unwrap_or_default().to_owned();
    assert!(subject.starts_with("2 of your watches"), "{subject}");
    let leader = sent.iter().map(|r| r.notification.id).min().unwrap();
    let message_id = read.header("message-id").unwrap_or_default().to_owned();
    assert!(message_id.contains(&leader.to_string()), "{message_id}");
    assert!(
        read.text.contains("SKU-ED1 now") && read.text.contains("SKU-ED3 now"),
        "{}",
        read.text
    );
    assert!(!read.text.contains("SKU-ED2"), "{}", read.text);
    p.stop().await;
    s.cleanup().await;
}

/// A reader who registered in Japanese is mailed in Japanese, and the pages the mail's links
/// open answer in Japanese: the confirmation (its question, its answer, a second use) and the
/// unsubscribe page and its answer. A link that names no one stays English.
#[tokio::test]
async fn a_japanese_readers_confirmation_and_unsubscribe_pages_are_in_japanese() {
    let s = Scenario::new().await;
    let smtp = FakeSmtp::start(&SmtpOptions::default()).unwrap();
    let (key_file, key) = dkim_key();
    let p = mailing_pipeline(&s, &smtp, &key_file).await;
    let to = "kana@tidings.test";
    let body = json!({"email": to, "time_zone": "Asia/Tokyo", "locale": "ja-JP"});
    let url = format!("{}/v1/devices", p.url("api"));
    let (status, created) = call(reqwest::Method::POST, url, None, Some(body)).await;
    assert_eq!(status, 201, "{created}");
    let mail = mails_to(&smtp, to, 1).await.pop().unwrap();
    assert_eq!(dkim_verdict(&mail, &key), "verified");
    let read = read(&mail);
    assert_eq!(read.header("subject"), Some("Tidingsの通知の確認"));
    let api = p.url("api");
    let confirm = read.link(&format!("{api}/v1/email/confirm?t=")).unwrap();
    let ja = |html: &str, line: &str| html.contains("<html lang=\"ja\">") && html.contains(line);
    let (status, _, asked) = page(&confirm, None).await;
    assert_eq!(
        (status, ja(&asked, "このアドレスに通知を送る")),
        (200, true),
        "{asked}"
    );
    let (status, _, done) = page(&confirm, Some("")).await;
    assert_eq!((status, ja(&done, "確認しました")), (200, true), "{done}");
    let (status, _, again) = page(&confirm, Some("")).await;
    assert_eq!((status, ja(&again, "使用済み")), (200, true), "{again}");
    let list = read.header("list-unsubscribe").unwrap();
    let https = list
        .split(['<', '>'])
        .find(|l| l.starts_with("http"))
        .unwrap();
    let (status, _, ask) = page(https, None).await;
    assert_eq!((status, ja(&ask, "メールの配信停止")), (200, true), "{ask}");
    let (status, _, stopped) = page(https, Some("List-Unsubscribe=One-Click")).await;
    assert_eq!(
        (status, ja(&stopped, "停止しました")),
        (200, true),
        "{stopped}"
    );
    let forged = format!("{api}/v1/email/confirm?t=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA");
    let (status, _, unknown) = page(&forged, Some("")).await;
    assert_eq!(status, 404);
    assert!(unknown.contains("<html lang=\"en\">"), "{unknown}");
    p.stop().await;
    s.cleanup().await;
}
