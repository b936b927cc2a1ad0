//! A notification's mail all the way out: composed, DKIM-signed, submitted to a real SMTP server
//! (aiosmtpd), and what the server received verified by an independent verifier (dkimpy).

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

#[path = "support/keys.rs"]
mod keys;

use chrono::Utc;
use std::time::Duration;
use tidings_domain::OutboxId;
use tidings_email::message::{Mail, MessageId, Unsubscribe, compose};
use tidings_email::relay::{Relay, RelaySettings, Security, Submitted};
use tidings_testkit::fake_smtp::{FakeSmtp, SmtpOptions};

#[tokio::test]
async fn a_notification_arrives_as_a_signed_mail_an_independent_verifier_accepts() {
    let row = OutboxId::new();
    // The words as `tidings_domain::mail` writes them for a reader in Tokyo (its tests check
    // them); here, what becomes of them on the way out.
    let subject = "SKU-1が指定価格を下回りました（09:02時点）";
    let text = "現在 999 JPY（指定価格: 1,200 JPY）\n\n09:02時点の情報です。09:22まで有効です。\n";
    let html = "<p>現在 999 JPY（指定価格: 1,200 JPY）</p>";
    let unsubscribe = "https://tidings.test/u/1?t=def";
    let id = row.to_string();
    let mail = compose(&Mail {
        from: "Tidings <alerts@tidings.test>",
        to: "reader@example.test",
        subject,
        text,
        html,
        message_id: MessageId {
            id: &id,
            domain: "tidings.test",
        },
        unsubscribe: Unsubscribe {
            https: unsubscribe,
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
