//! The services' pool: a connection back from use is handed out again without a ping, one that
//! sat idle is tested first, and a connection the server closed is replaced either way.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use sqlx::PgPool;
use std::time::Duration;
use tidings_store::{PING_IF_IDLE_FOR, needs_ping};
use tidings_testkit::harness::TestDb;

async fn backend_pid(pool: &PgPool) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
}

/// Waits until the pool's one connection is back among its idle ones. sqlx returns a connection
/// to the pool in a task of its own, pinging it on the way: a backend ended before that ping
/// is found dead at release and never handed out again, which is not the case under test.
async fn released(pool: &PgPool) {
    for _ in 0..200 {
        if pool.num_idle() == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the connection was not back in the pool within 1 s");
}

/// Ends backend `pid` from another connection and waits until it is gone.
async fn terminate(db: &TestDb, pid: i32) {
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(ended, "backend {pid} was not terminated");
    // Well inside PING_IF_IDLE_FOR, so the caller can still take the connection unpinged.
    for _ in 0..100 {
        let alive = db
            .count(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = {pid}"
            ))
            .await;
        if alive == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("backend {pid} still there 0.5 s after pg_terminate_backend");
}

#[test]
fn only_a_connection_idle_for_the_threshold_is_pinged() {
    assert!(!needs_ping(Duration::ZERO));
    assert!(!needs_ping(PING_IF_IDLE_FOR - Duration::from_millis(1)));
    assert!(needs_ping(PING_IF_IDLE_FOR));
    assert!(needs_ping(Duration::from_secs(3600)));
}

#[tokio::test]
async fn a_connection_closed_while_idle_is_tested_and_replaced_before_it_is_handed_out() {
    let db = TestDb::new().await.unwrap();
    // One connection, so the pool cannot hide a dead one behind a second.
    let pool = tidings_store::postgres(&db.url, 1).unwrap();
    let first = backend_pid(&pool).await.unwrap();
    terminate(&db, first).await;
    tokio::time::sleep(PING_IF_IDLE_FOR + Duration::from_millis(100)).await;

    let second = backend_pid(&pool)
        .await
        .expect("the idle connection's ping finds it closed and the pool opens another");
    assert_ne!(first, second);
}

#[tokio::test]
async fn a_connection_closed_just_after_its_release_fails_one_statement_then_is_replaced() {
    let db = TestDb::new().await.unwrap();
    let pool = tidings_store::postgres(&db.url, 1).unwrap();
    let first = backend_pid(&pool).await.unwrap();
    released(&pool).await;
    terminate(&db, first).await;

    // Handed out unpinged (it was released moments ago): the statement meets the closed socket.
    let failed = backend_pid(&pool).await;
    assert!(
        failed.is_err(),
        "a statement on the closed connection answered {failed:?}"
    );
    // Its release ping failed too, so the pool dropped it: the next statement gets a new one.
    let second = backend_pid(&pool).await.unwrap();
    assert_ne!(first, second);
}
