//! Reaching NATS as production does: a server list, user/password, an NKEY, TLS with client
//! certificates — each against a real nats-server that refuses anything else.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use async_nats::connection::State;
use std::path::PathBuf;
use std::time::Duration;
use tidings_bus::connection::ConnectionArgs;
use tidings_tests::brokers::PrivateNats;

/// Whether a client with these flags is connected (and can round-trip) within `wait`.
async fn connects(args: &ConnectionArgs, wait: Duration) -> bool {
    let client = args.connect().await.unwrap();
    let started = std::time::Instant::now();
    while started.elapsed() < wait {
        if client.connection_state() == State::Connected {
            return client.flush().await.is_ok();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/test-ca")
        .join(name)
}

/// Long enough for a refused login to have been tried several times over.
const REFUSED: Duration = Duration::from_secs(2);
const ACCEPTED: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_comma_separated_nats_url_reaches_whichever_server_is_up() {
    let down = PrivateNats::reserve().unwrap();
    let up = PrivateNats::started().await.unwrap();
    // The first entry refuses connections; the client moves on to the next.
    let args = ConnectionArgs::url(format!("{}, {}", down.url, up.url));
    assert!(connects(&args, ACCEPTED).await);
}

#[tokio::test]
async fn user_and_password_log_in_and_a_wrong_password_does_not() {
    let server =
        PrivateNats::with_config(r#"authorization { user: "tidings", password: "s3cr3t-pass" }"#)
            .await
            .unwrap();
    let mut args = ConnectionArgs::url(&server.url);
    assert!(!connects(&args, REFUSED).await, "no credentials: refused");
    args.nats_user = Some("tidings".into());
    args.nats_password = Some("wrong".into());
    assert!(!connects(&args, REFUSED).await, "wrong password: refused");
    args.nats_password = Some("s3cr3t-pass".into());
    assert!(connects(&args, ACCEPTED).await, "right password: accepted");
}

#[tokio::test]
async fn an_nkey_seed_file_logs_in() {
    let user = nkeys::KeyPair::new_user();
    let other = nkeys::KeyPair::new_user();
    let server = PrivateNats::with_config(&format!(
        r#"authorization {{ users = [ {{ nkey: "{}" }} ] }}"#,
        user.public_key()
    ))
    .await
    .unwrap();
    let dir = std::env::temp_dir().join(format!("tidings-nkey-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let seed_file = |name: &str, key: &nkeys::KeyPair| {
        let path = dir.join(name);
        std::fs::write(&path, format!("{}\n", key.seed().unwrap())).unwrap();
        path
    };
    let mut args = ConnectionArgs::url(&server.url);
    args.nats_nkey = Some(seed_file("other.nk", &other));
    let unknown = connects(&args, REFUSED).await;
    args.nats_nkey = Some(seed_file("user.nk", &user));
    let known = connects(&args, ACCEPTED).await;
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!unknown, "a key the server does not know: refused");
    assert!(known, "the user's key: accepted");
}

#[tokio::test]
async fn tls_with_a_private_ca_and_a_client_certificate() {
    let path = |name: &str| fixture(name).display().to_string();
    let server = PrivateNats::with_config(&format!(
        r#"tls {{ cert_file: "{}", key_file: "{}", ca_file: "{}", verify: true }}"#,
        path("server.pem"),
        path("server-key.pem"),
        path("ca.pem")
    ))
    .await
    .unwrap();
    let mut args = ConnectionArgs::url(&server.url);
    assert!(!connects(&args, REFUSED).await, "plain text: refused");
    args.nats_ca = Some(fixture("ca.pem"));
    assert!(
        !connects(&args, REFUSED).await,
        "TLS without a client certificate: refused"
    );
    args.nats_cert = Some(fixture("client.pem"));
    args.nats_key = Some(fixture("client-key.pem"));
    assert!(connects(&args, ACCEPTED).await, "mutual TLS: accepted");
}
