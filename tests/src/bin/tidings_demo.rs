//! `tidings-demo`: plays the demo scenario (`tidings_tests::demo`) against a running stack and
//! prints what happened. `deploy/local/stack run` starts everything and then runs this.
//! Configured by TIDINGS_DEMO_API, TIDINGS_DEMO_CATALOG_ADMIN, TIDINGS_DEMO_PUSH_ADMIN,
//! TIDINGS_DEMO_WEBHOOKS(_ADMIN), TIDINGS_DEMO_MAIL_FOLDER and TIDINGS_ADMIN_TOKEN.

use tidings_tests::demo::{self, Endpoints};

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| {
        eprintln!("tidings-demo: {key} is not set (deploy/local/stack run sets it)");
        std::process::exit(2)
    })
}

#[tokio::main]
async fn main() {
    let endpoints = Endpoints {
        api: env("TIDINGS_DEMO_API"),
        operators: env("TIDINGS_DEMO_OPERATORS"),
        catalog_admin: env("TIDINGS_DEMO_CATALOG_ADMIN"),
        push_admin: env("TIDINGS_DEMO_PUSH_ADMIN"),
        webhooks: env("TIDINGS_DEMO_WEBHOOKS"),
        webhooks_admin: env("TIDINGS_DEMO_WEBHOOKS_ADMIN"),
        mail_folder: env("TIDINGS_DEMO_MAIL_FOLDER").into(),
        admin_token: env("TIDINGS_ADMIN_TOKEN"),
    };
    match demo::run(endpoints, |line| println!("{line}")).await {
        Ok(report) => {
            println!();
            println!("the outbox (GET /v1/admin/outbox):");
            print!("{}", demo::table(&report.outbox));
        }
        Err(e) => {
            eprintln!("tidings-demo: {e}");
            std::process::exit(1);
        }
    }
}
