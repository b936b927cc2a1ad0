//! `tidings endpoint …`: an API client's own webhook endpoint, through the public api with the
//! endpoint's token: its status, its attempts, and a recovery after an outage on its side.

use crate::args::Endpoint;
use crate::client::{Api, CliError, exit};
use crate::table::{self, cell};
use serde_json::{Value, json};
use tidings_api_types::endpoints::{EndpointAttemptList, Recovered};

pub async fn run(api: &Api, json_out: bool, command: Endpoint) -> Result<u8, CliError> {
    match command {
        Endpoint::Status => {
            let status: Value = api.get("/v1/endpoints/me", &[]).await?;
            if json_out {
                println!("{}", cell(&status));
            } else {
                table::fields(
                    &status,
                    &[
                        "url",
                        "active",
                        "breaker",
                        "paused_until",
                        "consecutive_failures",
                        "pace_per_second",
                        "paced_until",
                    ],
                );
            }
        }
        Endpoint::Attempts { limit } => {
            let found = api
                .list::<EndpointAttemptList>("/v1/endpoints/me/attempts", &[], limit)
                .await?;
            table::listing(
                json_out,
                &found,
                &[
                    ("webhook", "/outbox_id"),
                    ("status", "/status"),
                    ("attempt", "/attempt"),
                    ("at", "/at"),
                    ("outcome", "/outcome"),
                    ("http", "/http_status"),
                    ("ms", "/duration_ms"),
                    ("answer", "/answer"),
                ],
            );
        }
        Endpoint::Recover { since } => {
            let since: chrono::DateTime<chrono::Utc> = since.parse().map_err(|e| {
                CliError::Usage(format!("--since {since:?} is not an RFC 3339 instant: {e}"))
            })?;
            let mut total = 0;
            loop {
                let done: Recovered = api
                    .post("/v1/endpoints/me/recover", &json!({ "since": since }))
                    .await?;
                total += done.replayed;
                if !done.more {
                    break;
                }
            }
            if json_out {
                println!("{}", json!({ "replayed": total }));
            } else {
                println!(
                    "{total} webhooks replayed; each is re-checked and sent if it still holds"
                );
            }
        }
    }
    Ok(exit::OK)
}
