//! `tidings-api serve`: the HTTP API. `tidings-api migrate`: the one command that applies the
//! schema (run once per deploy, e.g. as a Kubernetes Job, not raced by every replica).

use anyhow::Context;
use clap::{Parser, Subcommand};
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(name = "tidings-api", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve(Box<tidings_api::Config>),
    /// Apply pending database migrations and exit.
    Migrate {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Print the OpenAPI document and exit.
    Openapi,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve(config) => {
            let _telemetry = tidings_runtime::telemetry::Telemetry::init("tidings-api");
            let settings = config.settings()?;
            // Connects on first use: the api serves (and answers /readyz 503) while Postgres is
            // not there yet, instead of exiting into a crash loop.
            let pool = tidings_store::postgres(&config.database_url, config.db_pool)
                .context("DATABASE_URL")?;
            let listener = tokio::net::TcpListener::bind(config.listen)
                .await
                .with_context(|| format!("listening on {}", config.listen))?;
            tracing::info!(listen = %config.listen, "api serving");
            let shutdown = CancellationToken::new();
            tokio::spawn(tidings_runtime::signals::cancel_on_signal(shutdown.clone()));
            tidings_api::serve(listener, pool, settings, shutdown)
                .await
                .context("serving HTTP")?;
            tracing::info!("api stopped");
        }
        Command::Migrate { database_url } => {
            let _telemetry = tidings_runtime::telemetry::Telemetry::init("tidings-api");
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .connect(&database_url)
                .await
                .context("connecting to Postgres (DATABASE_URL)")?;
            tidings_store::db::MIGRATOR
                .run(&pool)
                .await
                .context("applying migrations")?;
            let applied = tidings_store::db::MIGRATOR.iter().count();
            tracing::info!(migrations = applied, "schema is up to date");
        }
        Command::Openapi => {
            println!(
                "{}",
                serde_json::to_string_pretty(tidings_api::openapi::document())?
            );
        }
    }
    Ok(())
}
