//! `tidings client …`: the API clients who may register webhook endpoints.

use crate::args::Client;
use crate::client::{Api, CliError, exit};
use crate::table::{self, cell};
use serde_json::json;
use tidings_api_types::clients::{ClientCreated, ClientList};

pub async fn run(api: &Api, json_out: bool, command: Client) -> Result<u8, CliError> {
    match command {
        Client::Create { name } => {
            let made: ClientCreated = api
                .post("/v1/admin/clients", &json!({"name": name}))
                .await?;
            if json_out {
                println!("{}", cell(&made));
            } else {
                table::fields(&made, &["client_id", "name", "created_at", "key"]);
                println!("\nThe key is shown only now: hand it to the client.");
            }
        }
        Client::Ls => {
            let found: ClientList = api.get("/v1/admin/clients", &[]).await?;
            table::listing(
                json_out,
                &found.items,
                &[
                    ("id", "/client_id"),
                    ("name", "/name"),
                    ("endpoints", "/endpoints"),
                    ("created", "/created_at"),
                    ("revoked", "/revoked_at"),
                ],
            );
        }
        Client::Revoke { id } => {
            api.delete(&format!("/v1/admin/clients/{id}")).await?;
            if !json_out {
                println!("client {id} revoked");
            }
        }
    }
    Ok(exit::OK)
}
