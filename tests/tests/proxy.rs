//! The api behind a reverse proxy, as an ingress runs it: two replicas behind nginx (Debian's),
//! the limits keyed on the address nginx saw and shared by the replicas
//! (`TIDINGS_API_TRUSTED_PROXIES`, `TIDINGS_API_REPLICAS`).

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Instant;
use tidings_tests::brokers::free_port;
use tidings_tests::fake_push::FakePushService;
use tidings_tests::harness::{poll_wait, tool};
use tidings_tests::scenario::Scenario;
use tidings_tests::services::Pipeline;

/// nginx in front of `upstreams` (round robin, as ingress-nginx balances by default), appending
/// the client's address to `X-Forwarded-For`.
struct Nginx {
    child: Child,
    url: String,
    dir: PathBuf,
}

impl Nginx {
    async fn start(upstreams: &[String]) -> Nginx {
        let dir = std::env::temp_dir().join(format!("tidings-nginx-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port().unwrap();
        let servers: String = upstreams
            .iter()
            .map(|u| format!("server {};\n", u.trim_start_matches("http://")))
            .collect();
        let d = dir.display();
        let conf = format!(
            "daemon off;\nmaster_process off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{}}\nhttp {{\naccess_log off;\nclient_body_temp_path {d}/body;\n\
             proxy_temp_path {d}/proxy;\nfastcgi_temp_path {d}/fastcgi;\nuwsgi_temp_path {d}/uwsgi;\n\
             scgi_temp_path {d}/scgi;\nupstream api {{\n{servers}}}\nserver {{\n\
             listen 127.0.0.1:{port};\nlocation / {{\nproxy_pass http://api;\n\
             proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n}}\n}}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new(tool("nginx").unwrap())
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while reqwest::get(format!("{url}/livez")).await.is_err() {
            poll_wait(started, 10, || {
                std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
            })
            .await;
        }
        Nginx { child, url, dir }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// How many of `tries` device registrations through `url` from the local address `from` were
/// taken (201); `forwarded` is an `X-Forwarded-For` the client itself sends.
async fn registered(url: &str, from: &str, tries: usize, forwarded: Option<&str>) -> usize {
    let client = reqwest::Client::builder()
        .local_address(from.parse::<IpAddr>().unwrap())
        .build()
        .unwrap();
    let sub = FakePushService::start().await.unwrap().subscription();
    let body = serde_json::json!({"time_zone": "UTC", "subscription": {
        "endpoint": sub.endpoint, "keys": {"p256dh": sub.p256dh, "auth": sub.auth}}});
    let mut taken = 0;
    for _ in 0..tries {
        let mut request = client.post(format!("{url}/v1/devices")).json(&body);
        if let Some(f) = forwarded {
            request = request.header("x-forwarded-for", f);
        }
        let status = request.send().await.unwrap().status().as_u16();
        assert!(status == 201 || status == 429, "{status}");
        taken += usize::from(status == 201);
    }
    taken
}

#[tokio::test]
async fn behind_a_proxy_two_replicas_limit_each_user_separately_and_once() {
    let s = Scenario::new().await;
    let env = [
        ("TIDINGS_API_REGISTER_RATE", "4/h"),
        ("TIDINGS_API_TRUSTED_PROXIES", "1"),
        ("TIDINGS_API_REPLICAS", "2"),
    ];
    let one = Pipeline::start_only(&s, &["api"], &env).await;
    let two = Pipeline::start_only(&s, &["api"], &env).await;
    let nginx = Nginx::start(&[one.url("api"), two.url("api")]).await;
    // Each user is limited as configured, 4 an hour over both replicas, not 8 ...
    assert_eq!(registered(&nginx.url, "127.0.0.2", 10, None).await, 4);
    // ... and apart from the other: the proxy's own address is not the key.
    assert_eq!(registered(&nginx.url, "127.0.0.3", 10, None).await, 4);
    // A client that writes its own X-Forwarded-For is still keyed on the address nginx saw.
    let spoofed = registered(&nginx.url, "127.0.0.2", 4, Some("198.51.100.7")).await;
    assert_eq!(spoofed, 0);
    let registered_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM devices")
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(registered_rows, 8);
    drop(nginx);
    one.stop().await;
    two.stop().await;
    s.cleanup().await;
}
