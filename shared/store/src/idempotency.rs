//! Idempotency-Key records: a create's key, the hash of its request body and the response it got,
//! kept for a day so a retry with the same key gets the same answer.

use sqlx::{PgConnection, PgPool};
use tidings_domain::DeviceId;

/// What a key's first request was and what it was answered.
#[derive(Debug)]
pub struct Stored {
    pub request_hash: Vec<u8>,
    pub status: i16,
    pub response: serde_json::Value,
}

/// Claims `key` for device `device` in `conn`'s transaction; false if it was claimed before. A
/// concurrent claim of the same key waits on the key's unique index until this transaction ends.
pub async fn claim(
    conn: &mut PgConnection,
    device: DeviceId,
    key: &str,
    request_hash: &[u8],
) -> Result<bool, sqlx::Error> {
    let claimed = sqlx::query!(
        "INSERT INTO idempotency_keys (device_id, key, request_hash, status, response)
         VALUES ($1, $2, $3, 0, 'null') ON CONFLICT DO NOTHING",
        device.0,
        key,
        request_hash
    )
    .execute(conn)
    .await?
    .rows_affected();
    Ok(claimed == 1)
}

/// Records the answer to the request that claimed `key`, in the claim's transaction.
pub async fn record(
    conn: &mut PgConnection,
    device: DeviceId,
    key: &str,
    status: i16,
    response: &serde_json::Value,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE idempotency_keys SET status = $3, response = $4 WHERE device_id = $1 AND key = $2",
        device.0,
        key,
        status,
        response
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// The record of `key` for device `device`.
pub async fn read(pool: &PgPool, device: DeviceId, key: &str) -> Result<Stored, sqlx::Error> {
    sqlx::query_as!(
        Stored,
        "SELECT request_hash, status, response FROM idempotency_keys
         WHERE device_id = $1 AND key = $2",
        device.0,
        key
    )
    .fetch_one(pool)
    .await
}

/// Deletes the records older than a day; how many went.
pub async fn expire(pool: &PgPool) -> Result<u64, sqlx::Error> {
    Ok(
        sqlx::query!("DELETE FROM idempotency_keys WHERE created_at < now() - interval '24 hours'")
            .execute(pool)
            .await?
            .rows_affected(),
    )
}
