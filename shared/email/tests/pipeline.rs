//! A notification, all the way out as a mail: the domain's words (`tidings_domain::mail`),
//! composed, DKIM-signed, submitted to a real SMTP server (aiosmtpd), and what the server received
//! verified by an independent verifier (dkimpy).

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

#[path = "support/keys.rs"]
mod keys;

use chrono::{TimeZone, Utc};
use std::time::Duration;
use tidings_domain::item::ItemCode;
use tidings_domain::mail::{Links, render};
use tidings_domain::notification::Notice;
use tidings_domain::trigger::{Baseline, Observation, Trigger};
use tidings_domain::{OutboxId, WatchId};
use tidings_email::message::{Mail, MessageId, Unsubscribe, compose};
use tidings_email::relay::{Relay, RelaySettings, Security, Submitted};
use tidings_testkit::fake_smtp::{FakeSmtp, SmtpOptions};

#[tokio::test]
async fn a_notification_arrives_as_a_signed_mail_an_independent_verifier_accepts() {
    let item = ItemCode::parse("SKU-1").unwrap();
    let seen = Utc.with_ymd_and_hms(2026, 12, 5, 0, 2, 0).unwrap();
    let now = Observation::on_sale(999, "JPY", seen);
    let row = OutboxId::new();
    let links = Links {
        check: "https://tidings.test/n/1?t=abc",
        unsubscribe: "https://tidings.test/u/1?t=def",
    };
    let words = render(
        &Notice {
            id: row,
            watch: WatchId::new(),
            trigger: &Trigger::PriceBelow { threshold: 1200 },
            item: &item,
            now: &now,
            baseline: &Baseline::default(),
            valid_until: seen + chrono::Duration::minutes(20),
            item_url: None,
            locale: Some("ja-JP"),
        },
        chrono_tz::Asia::Tokyo,
        &links,
    );
    let id = row.to_string();
    let mail = compose(&Mail {
        from: "Tidings <alerts@tidings.test>",
        to: "reader@example.test",
        subject: &words.subject,
        text: &words.text,
        html: &words.html,
        message_id: MessageId {
            id: &id,
            domain: "tidings.test",
        },
        unsubscribe: Unsubscribe {
            https: links.unsubscribe,
            mailto: "unsubscribe@tidings.test",
        },
        date: Utc::now(),
    })
    .unwrap();
    let key = keys::rsa_key();
    let signed = key.sign(&mail, Utc::now()).unwrap();

    let smtp = FakeSmtp::start(&SmtpOptions::default()).unwrap();
    let relay = Relay::new(RelaySettings {
        host: "127.0.0.1".into(),
        port: smtp.port,
        security: Security::Plain,
        credentials: None,
        hello: "tidings.test".into(),
        timeout: Duration::from_secs(5),
        roots_pem: None,
        idle: 1,
    })
    .unwrap();
    let sent = relay
        .submit("alerts@tidings.test", "reader@example.test", &signed)
        .await
        .unwrap();
    assert!(matches!(sent, Submitted::Accepted { .. }), "{sent:?}");

    let received = smtp.received();
    assert_eq!(received.len(), 1);
    assert_eq!(keys::verdict(&received[0].1, &key), "verified");
    let text = String::from_utf8(received[0].1.clone()).unwrap();
    assert!(
        text.contains(&format!("Message-ID: <{id}@tidings.test>")),
        "{text}"
    );
    // The Japanese subject travels RFC 2047-encoded: every header is ASCII on the wire.
    let (head, _) = text.split_once("\r\n\r\n").unwrap();
    assert!(
        head.is_ascii() && head.contains("Subject: =?utf-8?"),
        "{head}"
    );
}
