//! `tidings-api`: the HTTP API, and `tidings-api migrate`, the one command that applies the
//! schema (run once per deploy, e.g. as a Kubernetes Job, not raced by every replica).

use anyhow::Context;
use clap::{Parser, Subcommand};
use sqlx::postgres::PgPoolOptions;

#[derive(Parser)]
#[command(name = "tidings-api", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply pending database migrations and exit.
    Migrate {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tidings_shared::service::init_logging();
    match Cli::parse().command {
        Command::Migrate { database_url } => {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .connect(&database_url)
                .await
                .context("connecting to Postgres (DATABASE_URL)")?;
            tidings_shared::db::MIGRATOR
                .run(&pool)
                .await
                .context("applying migrations")?;
            let applied = tidings_shared::db::MIGRATOR.iter().count();
            tracing::info!(migrations = applied, "schema is up to date");
        }
    }
    Ok(())
}
