//! Postgres over TLS, configured the standard way: `sslmode=verify-full` and `sslrootcert` in
//! `DATABASE_URL`. The local stack's Postgres serves the test CA's certificate for 127.0.0.1.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use tidings_testkit::harness::TestDb;

fn fixture(path: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(path)
        .display()
        .to_string()
}

/// The test database's URL with TLS verified against `ca`.
fn verified(url: &str, ca: &str) -> String {
    let (base, _) = url.split_once('?').unwrap_or((url, ""));
    format!("{base}?sslmode=verify-full&sslrootcert={ca}")
}

#[tokio::test]
async fn database_url_with_sslmode_verify_full_connects_over_tls_and_checks_the_server() {
    let db = TestDb::new().await.unwrap();
    let url = verified(&db.url, &fixture("test-ca/ca.pem"));
    let pool = tidings_store::postgres(&url, 1).unwrap();
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .unwrap_or_else(|e| {
            panic!("{url}: {e} (a stack started before Postgres served TLS: `deploy/local/stack down` and run again)")
        });
    assert!(ssl, "the connection is encrypted");
    pool.close().await;

    // A server whose certificate the given CA did not sign is refused.
    let other_ca = verified(&db.url, &fixture("tls/cert.pem"));
    let pool = tidings_store::postgres(&other_ca, 1).unwrap();
    let refused = sqlx::query("SELECT 1").execute(&pool).await.unwrap_err();
    assert!(
        refused.to_string().contains("certificate"),
        "refused, but not for its certificate: {refused}"
    );
}
