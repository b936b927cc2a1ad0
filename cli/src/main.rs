//! `tidings`: the operator's command line over the operator api; see `tidings --help` for the
//! commands and exit codes. (The schema is applied by `tidings-api migrate`, and VAPID keys are
//! made by `tidings-pusher vapid-keygen`: one command each.)

mod args;
mod audit;
mod client;
mod clients;
mod dead_letters;
mod doctor;
mod endpoint;
mod objects;
mod outbox;
mod table;

use args::{Cli, Command};
use clap::Parser;
use client::{Api, CliError};
use std::process::ExitCode;

fn token(cli: &Cli) -> Result<String, CliError> {
    if let Some(t) = &cli.token {
        return Ok(t.clone());
    }
    if let Some(path) = &cli.token_file {
        let text = std::fs::read_to_string(path).map_err(|e| CliError::TokenFile {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
        return Ok(text.trim().to_owned());
    }
    Err(CliError::Usage(
        "no operator token: set TIDINGS_ADMIN_TOKEN or TIDINGS_ADMIN_TOKEN_FILE (or --token, --token-file)".into(),
    ))
}

async fn run(cli: Cli) -> Result<u8, CliError> {
    let json = cli.json;
    // A client's own endpoint goes through the public api with its token, not the operator's.
    if let Command::Endpoint(e) = cli.command {
        let api = Api::new(&e.url, e.endpoint_token)?;
        return endpoint::run(&api, json, e.command).await;
    }
    let api = Api::new(&cli.api, token(&cli)?)?;
    match cli.command {
        Command::Endpoint(_) => Ok(client::exit::USAGE),
        Command::Outbox(c) => outbox::run(&api, json, *c).await,
        Command::Attempts { id } => outbox::attempts(&api, json, &id).await,
        Command::Dlq(c) => dead_letters::run(&api, json, *c).await,
        Command::Device(c) => objects::run(&api, json, objects::Kind::Device, c).await,
        Command::Watch(c) => objects::run(&api, json, objects::Kind::Watch, c).await,
        Command::Client(c) => clients::run(&api, json, c).await,
        Command::Audit {
            operator,
            since,
            limit,
        } => audit::run(&api, json, operator, since, limit).await,
        Command::Doctor {
            max_lag,
            max_due_age,
        } => doctor::run(&api, json, max_lag, max_due_age).await,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            // The whole chain: an answer that cannot be read says which field was wrong.
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text.push_str(&format!(": {c}"));
                cause = c.source();
            }
            eprintln!("tidings: {}", table::shown(&text));
            ExitCode::from(e.exit_code())
        }
    }
}
