//! The demo's stand-ins for the outside world: the fake catalog (items whose prices the demo
//! sets), the fake push service (HTTPS with the fixture certificate; decrypts and verifies
//! every push), a webhook receiver (HTTPS too), with plain-HTTP admin endpoints, and a real
//! SMTP server (aiosmtpd) keeping what it accepts in a folder. Listens where
//! `--catalog`, `--push`, `--webhooks` and `--admin` say (default: free ports on 127.0.0.1),
//! prints the URLs as KEY=value lines, and runs until SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use tidings_testkit::fake_catalog::FakeCatalog;
use tidings_testkit::fake_push::FakePushService;
use tidings_testkit::fake_smtp::{FakeSmtp, SmtpOptions};
use tidings_testkit::fake_webhooks::FakeWebhookReceiver;

fn addr(flag: &str) -> SocketAddr {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|e| panic!("{flag} {v}: not an address ({e})"))
        })
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let catalog = FakeCatalog::start_on(addr("--catalog")).await?;
    let push = FakePushService::start_on(addr("--push")).await?;
    let webhooks = FakeWebhookReceiver::start_on(addr("--webhooks")).await?;
    // A real SMTP server (aiosmtpd, from the stack's tools) on a free port, plain.
    let smtp = FakeSmtp::start(&SmtpOptions::default())?;
    let admin = tokio::net::TcpListener::bind(addr("--admin")).await?;
    let admin_addr = admin.local_addr()?;
    println!("CATALOG_ITEM_URL={}", catalog.item_url());
    println!("CATALOG_BATCH_URL={}", catalog.batch_url());
    println!("CATALOG_ADMIN=http://{}/admin/items", catalog.addr);
    println!("PUSH_ORIGIN=https://{}", push.addr);
    println!("PUSH_ADMIN=http://{admin_addr}/admin/push");
    println!("WEBHOOKS_URL={}", webhooks.url("demo"));
    println!("WEBHOOKS_ADMIN=http://{admin_addr}/admin/webhooks");
    println!("SMTP_PORT={}", smtp.port);
    println!("MAIL_FOLDER={}", smtp.folder().display());
    let router = push.admin_router().merge(webhooks.admin_router());
    let server = axum::serve(admin, router).with_graceful_shutdown(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    });
    server.await
}
