//! Email devices in the store: the confirmation limits hold per address and per domain, a link
//! confirms once and not after it expires, a bounce stops every subscription of its address, a
//! refused mailbox is deactivated as `mailbox_rejected`, and `reseal` finds mail link keys.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use chrono::{Duration, Utc};
use tidings_domain::subscription::Deactivation;
use tidings_domain::{DeviceId, SubscriptionId};
use tidings_store::devices::{NewDevice, subscriptions};
use tidings_store::mailboxes::{self, Allowed, Confirmed, MailLimits, NewConfirmation, NewMailbox};
use tidings_testkit::harness::TestDb;

const LIMITS: MailLimits = MailLimits {
    per_address_per_day: 2,
    per_domain_per_hour: 3,
};

/// Registers `address` with a confirmation token hashing to `token` (32 bytes) that expires
/// `expires_in` from now.
async fn register(
    db: &TestDb,
    address: &str,
    token: u8,
    expires_in: Duration,
) -> (Allowed, DeviceId, SubscriptionId) {
    let device = DeviceId::new();
    let subscription = SubscriptionId::new();
    let device_token = [token ^ 0xff; 32];
    let confirm = [token; 32];
    let m = NewMailbox {
        device: NewDevice {
            id: device,
            token_hash: &device_token,
            time_zone: "UTC",
            locale: None,
            preferences: &Default::default(),
        },
        subscription,
        address,
        domain: address.rsplit_once('@').unwrap().1,
        link_key: "link-key",
        confirmation: NewConfirmation {
            token_hash: &confirm,
            expires_at: Utc::now() + expires_in,
        },
    };
    let allowed = mailboxes::register(&db.pool, m, LIMITS).await.unwrap();
    (allowed, device, subscription)
}

async fn reason(db: &TestDb, device: DeviceId) -> Option<Deactivation> {
    subscriptions(&db.pool, device).await.unwrap()[0].deactivation_reason
}

#[tokio::test]
async fn confirmation_mails_are_limited_per_address_and_per_domain() {
    let db = TestDb::new().await.unwrap();
    let day = Duration::hours(24);
    assert_eq!(register(&db, "a@one.test", 1, day).await.0, Allowed::Yes);
    assert_eq!(register(&db, "a@one.test", 2, day).await.0, Allowed::Yes);
    assert_eq!(
        register(&db, "a@one.test", 3, day).await.0,
        Allowed::AddressLimited
    );
    assert_eq!(register(&db, "b@one.test", 4, day).await.0, Allowed::Yes);
    assert_eq!(
        register(&db, "c@one.test", 5, day).await.0,
        Allowed::DomainLimited
    );
    assert_eq!(register(&db, "c@two.test", 6, day).await.0, Allowed::Yes);
    // A refused registration leaves nothing behind.
    let devices: i64 = sqlx::query_scalar("SELECT count(*) FROM devices")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(devices, 4);
}

#[tokio::test]
async fn a_link_confirms_once_and_not_once_expired() {
    let db = TestDb::new().await.unwrap();
    let (_, device, sub) = register(&db, "a@one.test", 1, Duration::hours(24)).await;
    let unconfirmed = || async {
        mailboxes::address(&db.pool, device)
            .await
            .unwrap()
            .unwrap()
            .unconfirmed
    };
    assert!(unconfirmed().await);
    assert_eq!(
        mailboxes::confirm(&db.pool, &[9; 32]).await.unwrap(),
        (Confirmed::Unknown, None)
    );
    assert_eq!(
        mailboxes::confirm(&db.pool, &[1; 32]).await.unwrap().0,
        Confirmed::Yes(sub)
    );
    assert!(!unconfirmed().await);
    assert_eq!(
        mailboxes::confirm(&db.pool, &[1; 32]).await.unwrap().0,
        Confirmed::AlreadyUsed
    );
    let (_, other, _) = register(&db, "b@one.test", 2, Duration::seconds(-1)).await;
    assert_eq!(
        mailboxes::confirm(&db.pool, &[2; 32]).await.unwrap().0,
        Confirmed::Expired
    );
    assert!(
        (mailboxes::address(&db.pool, other).await.unwrap().unwrap()).unconfirmed,
        "an expired link confirms nothing"
    );
}

#[tokio::test]
async fn bounces_and_refused_mailboxes_stop_the_mail_and_reseal_finds_link_keys() {
    let db = TestDb::new().await.unwrap();
    let (_, a, a_sub) = register(&db, "a@one.test", 1, Duration::hours(1)).await;
    let (_, b, _) = register(&db, "b@one.test", 2, Duration::hours(1)).await;
    let stopped =
        mailboxes::deactivate_address(&db.pool, "b@one.test", Deactivation::MailboxRejected)
            .await
            .unwrap();
    assert_eq!(stopped, 1);
    assert_eq!(reason(&db, b).await, Some(Deactivation::MailboxRejected));
    assert_eq!(reason(&db, a).await, None);
    // A 5xx to RCPT ends a row `subscription_gone`; its email subscription is deactivated as a
    // refused mailbox, not as a push service's 410.
    let mut conn = db.pool.acquire().await.unwrap();
    tidings_store::subscriptions::deactivate_gone(&mut conn, &[a_sub])
        .await
        .unwrap();
    assert_eq!(reason(&db, a).await, Some(Deactivation::MailboxRejected));
    // `tidings-api reseal` pages through every sealed secret, the mail link keys included.
    let stored = tidings_store::endpoints::stored_secrets(&db.pool, None, 10)
        .await
        .unwrap();
    assert_eq!(stored.len(), 2, "{stored:?}");
}
