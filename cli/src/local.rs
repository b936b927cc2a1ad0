//! The commands that need no api: `tidings vapid keygen` and `tidings migrate`.

use crate::client::{CliError, exit};
use serde_json::json;

pub fn vapid_keygen(json_out: bool) -> Result<u8, CliError> {
    let (private, public) = tidings_webpush::vapid::VapidKey::generate()
        .map_err(|e| CliError::Local(format!("making a VAPID key pair: {e}")))?;
    if json_out {
        println!("{}", json!({"private_key": private, "public_key": public}));
    } else {
        println!(
            "# Every pusher signs with the private key; the api hands browsers the public one."
        );
        println!("TIDINGS_VAPID_PRIVATE_KEY={private}");
        println!("TIDINGS_VAPID_PUBLIC_KEY={public}");
    }
    Ok(exit::OK)
}

pub async fn migrate(database_url: &str, json_out: bool) -> Result<u8, CliError> {
    // One connection of its own: a refused or unknown database is said at once, not after a
    // pool's acquire timeout.
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(database_url)
        .await
        .map_err(|e| CliError::Local(format!("connecting to DATABASE_URL: {e}")))?;
    let migrated = tidings_store::schema::migrate(&mut conn)
        .await
        .map_err(|e| CliError::Local(format!("applying migrations: {e}")))?;
    let version = migrated.version;
    if json_out {
        println!(
            "{}",
            json!({"schema_version": version, "newer_migrations": migrated.newer})
        );
    } else {
        println!("the schema is at migration {version}");
        if !migrated.newer.is_empty() {
            println!(
                "the database also has migrations {:?}, newer than this build: a newer release \
                 applied them; they stay",
                migrated.newer
            );
        }
    }
    Ok(exit::OK)
}
