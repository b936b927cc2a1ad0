//! Watches in bulk, for benchmarks that need more than the api would make in reasonable time.

use sqlx::PgPool;
use uuid::Uuid;

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
