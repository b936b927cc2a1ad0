//! Tidings' DKIM signatures checked by a verifier we did not write (dkimpy, from the stack's
//! tools), over a mail whose subject tries to inject a header: RSA-SHA256 and Ed25519-SHA256
//! verify, and a byte changed in a signed header or the body does not.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

#[path = "support/keys.rs"]
mod keys;

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::{Ed25519KeyPair, RsaKeyPair};
use chrono::{TimeZone, Utc};
use keys::{pem, verdict};
use tidings_email::dkim::DkimKey;
use tidings_email::message::{Mail, MessageId, Unsubscribe, compose};

fn hostile_mail() -> Vec<u8> {
    compose(&Mail {
        from: "Tidings <alerts@tidings.test>",
        to: "someone@example.test",
        subject: "Tee — 9.99 EUR\r\nBcc: victim@evil.test",
        text: "Tee is 9.99 EUR as of 09:00 \r\nand holds until 10:00.\r\n\r\n",
        html: "<p>Tee is <b>9.99 EUR</b></p>",
        message_id: MessageId {
            id: "0192e4a1-7b3c-7d2e-9f10-3a4b5c6d7e8f",
            domain: "tidings.test",
        },
        unsubscribe: Unsubscribe {
            https: "https://tidings.test/u/abc",
            mailto: "unsubscribe@tidings.test",
        },
        date: Utc.with_ymd_and_hms(2026, 12, 5, 9, 0, 0).unwrap(),
    })
    .unwrap()
}

#[test]
fn an_independent_verifier_accepts_both_signatures_and_refuses_a_changed_mail() {
    let rsa = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    let rsa = pem(rsa.as_der().unwrap().as_ref());
    let ed = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let ed = pem(ed.as_ref());
    let now = Utc::now();
    for (what, key) in [("rsa", rsa), ("ed25519", ed)] {
        let key = DkimKey::from_pem(key.as_bytes(), "tidings.test", "mail2026").unwrap();
        assert!(key.dns_record().1.contains(&format!("k={what};")));
        let signed = key.sign(&hostile_mail(), now).unwrap();
        assert_eq!(verdict(&signed, &key), "verified", "{what}");

        let text = String::from_utf8(signed).unwrap();
        let subject = text.replacen("Subject: ", "Subject: Re: ", 1);
        assert_eq!(
            verdict(subject.as_bytes(), &key),
            "refused",
            "{what}: subject"
        );
        let body = text.replacen("holds until", "holds till", 1);
        assert_ne!(body, text);
        assert_eq!(verdict(body.as_bytes(), &key), "refused", "{what}: body");
    }
}
