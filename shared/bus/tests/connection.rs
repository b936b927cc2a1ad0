//! Reaching NATS as production does: a server list, user/password, an NKEY, TLS with client
//! certificates — each against a real nats-server that refuses anything else.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use async_nats::connection::State;
use std::path::PathBuf;
use std::time::Duration;
use tidings_bus::connection::ConnectionArgs;
use tidings_testkit::brokers::PrivateNats;

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

/// A JWT as NATS signs them: the claims signed with an NKEY (`ed25519-nkey`).
fn jwt(signer: &nkeys::KeyPair, subject: &str, name: &str, nats: serde_json::Value) -> String {
    use base64::Engine as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let header = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let claims = serde_json::json!({
        "jti": uuid::Uuid::new_v4().simple().to_string().to_uppercase(),
        "iat": 1_700_000_000,
        "iss": signer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let payload = b64(claims.to_string().as_bytes());
    let signature = signer
        .sign(format!("{header}.{payload}").as_bytes())
        .unwrap();
    format!("{header}.{payload}.{}", b64(&signature))
}

#[tokio::test]
async fn a_credentials_file_logs_in_to_a_server_in_operator_mode() {
    // An operator, an account it signed, a user the account signed: decentralized auth as
    // `nsc` sets it up.
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let user = nkeys::KeyPair::new_user();
    let unlimited = serde_json::json!({"subs": -1, "data": -1, "payload": -1});
    let operator_jwt = jwt(
        &operator,
        &operator.public_key(),
        "tidings-test",
        serde_json::json!({"type": "operator", "version": 2}),
    );
    let mut account_limits = unlimited.clone();
    for key in ["imports", "exports", "conn", "leaf"] {
        account_limits[key] = (-1).into();
    }
    account_limits["wildcards"] = true.into();
    let account_jwt = jwt(
        &operator,
        &account.public_key(),
        "tidings",
        serde_json::json!({"limits": account_limits, "type": "account", "version": 2}),
    );
    let mut user_claims = unlimited;
    user_claims["pub"] = serde_json::json!({});
    user_claims["sub"] = serde_json::json!({});
    user_claims["type"] = "user".into();
    user_claims["version"] = 2.into();
    let user_jwt = jwt(
        &account,
        &user.public_key(),
        "tidings-services",
        user_claims,
    );

    // JetStream needs the server's own system account.
    let system = nkeys::KeyPair::new_account();
    let system_jwt = jwt(
        &operator,
        &system.public_key(),
        "SYS",
        serde_json::json!({"limits": account_limits, "type": "account", "version": 2}),
    );
    let server = PrivateNats::with_config(&format!(
        "operator: {operator_jwt}\nsystem_account: {sys}\nresolver: MEMORY\n\
         resolver_preload: {{ {sys}: {system_jwt}, {account}: {account_jwt} }}\n",
        sys = system.public_key(),
        account = account.public_key(),
    ))
    .await
    .unwrap();
    let dir = std::env::temp_dir().join(format!("tidings-creds-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let creds = |jwt: &str, seed: &str| {
        let path = dir.join(format!("{}.creds", uuid::Uuid::new_v4()));
        std::fs::write(
            &path,
            format!(
                "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
                 ************************* IMPORTANT *************************\n\
                 NKEY Seed printed below can be used to sign and prove identity.\n\n\
                 -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
            ),
        )
        .unwrap();
        path
    };
    let mut args = ConnectionArgs::url(&server.url);
    assert!(!connects(&args, REFUSED).await, "no credentials: refused");
    // The user's JWT with another key's seed cannot answer the server's challenge.
    let stranger = nkeys::KeyPair::new_user();
    args.nats_creds = Some(creds(&user_jwt, &stranger.seed().unwrap()));
    let forged = connects(&args, REFUSED).await;
    args.nats_creds = Some(creds(&user_jwt, &user.seed().unwrap()));
    let genuine = connects(&args, ACCEPTED).await;
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!forged, "a seed that does not match the JWT: refused");
    assert!(genuine, "the credentials file: accepted");
}
