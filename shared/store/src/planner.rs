//! Planner settings for one transaction, for statements whose right plan Postgres' statistics
//! can hide from it: they lag a table that fills fast, and a connection keeps a statement's plan
//! until they change.

use sqlx::PgConnection;

/// Sets each `(setting, value)` until the transaction ends (`set_config(…, true)`). Outside a
/// transaction it has no effect: the settings end with their own statement.
pub async fn for_transaction(
    conn: &mut PgConnection,
    settings: &[(&str, &str)],
) -> Result<(), sqlx::Error> {
    let (names, values): (Vec<&str>, Vec<&str>) = settings.iter().copied().unzip();
    sqlx::query!(
        r#"SELECT set_config(s.name, s.value, true) AS "set!"
           FROM unnest($1::text[], $2::text[]) AS s(name, value)"#,
        &names as &[&str],
        &values as &[&str],
    )
    .fetch_all(conn)
    .await?;
    Ok(())
}
