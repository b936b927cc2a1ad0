//! Devices and watches in bulk, for benchmarks that need more than the api would make in
//! reasonable time.

use sqlx::PgPool;
use tidings_domain::messages::Subscription;
use uuid::Uuid;

/// A Web Push device in `time_zone` with `preferences`, subscribed at `sub`: its id.
pub async fn device(
    pool: &PgPool,
    time_zone: &str,
    preferences: &serde_json::Value,
    sub: &Subscription,
) -> Result<Uuid, sqlx::Error> {
    let device = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO devices (id, token_hash, time_zone, preferences)
         VALUES ($1, decode(md5($1::text) || md5($1::text || 'x'), 'hex'), $2, $3)",
    )
    .bind(device)
    .bind(time_zone)
    .bind(preferences)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO push_subscriptions (id, device_id, endpoint, p256dh, auth)
         VALUES (gen_random_uuid(), $1, $2, $3, $4)",
    )
    .bind(device)
    .bind(&sub.endpoint)
    .bind(&sub.p256dh)
    .bind(&sub.auth)
    .execute(pool)
    .await?;
    Ok(device)
}

/// One watch of `device` per code in `codes`, for a price below `threshold` with `reference` as
/// its reference price, in one statement; then `ANALYZE`, so the planner knows the table as a
/// database that has held its watches a while would.
pub async fn watches(
    pool: &PgPool,
    device: Uuid,
    codes: &[String],
    threshold: i64,
    reference: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO watches (id, device_id, item_code, triggers, reference_price)
         SELECT gen_random_uuid(), $1, code, $3, $4 FROM unnest($2::text[]) code",
    )
    .bind(device)
    .bind(codes)
    .bind(serde_json::json!([{"kind": "price_below", "threshold": threshold}]))
    .bind(reference)
    .execute(pool)
    .await?;
    sqlx::query("ANALYZE watches").execute(pool).await?;
    Ok(())
}
