//! Push subscriptions as the pipeline changes them.

use sqlx::PgConnection;
use tidings_domain::SubscriptionId;

/// Deactivates subscriptions the push service said are gone (404, 410).
pub async fn deactivate_gone(
    conn: &mut PgConnection,
    ids: &[SubscriptionId],
) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE push_subscriptions
         SET active = false, deactivated_at = now(), deactivation_reason = 'gone'
         WHERE id = ANY($1) AND active",
    )
    .bind(ids)
    .execute(conn)
    .await?;
    Ok(())
}
