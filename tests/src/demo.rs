//! The demo scenario, over HTTP only (the api, the fakes' admin endpoints), so the same code
//! drives `tidings-demo` against a running stack and the end-to-end test against binaries the
//! test started:
//!
//! - a device registers and watches items A, B and C (each "below 12.00");
//! - A drops to 9.99: delivered, and the fake push service shows the decrypted text;
//! - B drops to 11.00 and is back at 15.00 by the time the dispatcher re-checks: withheld
//!   (`dropped`/`condition_lost`), nothing is sent;
//! - C drops to 10.00 while the push service answers 429, then 500: `retry` twice, then `sent`,
//!   and the operator api shows its three attempts;
//! - A is back at 15.00 while its notification is current: withdrawn in place;
//! - an API client, with a key the operator issued, registers a webhook endpoint and watches D;
//!   D drops to 8.99: a signed webhook with the re-checked value arrives, its signature verified;
//! - an email device confirms its address and watches E; E drops to 9.49: the mail reaches a
//!   local SMTP server, its DKIM signature verified by `dkimpy`.

use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

pub struct Endpoints {
    /// e.g. `http://127.0.0.1:8080`
    pub api: String,
    /// The api's ops port (operator routes), e.g. `http://127.0.0.1:9090`.
    pub operators: String,
    /// e.g. `http://127.0.0.1:9000/admin/items`
    pub catalog_admin: String,
    /// e.g. `http://127.0.0.1:9002/admin/push`
    pub push_admin: String,
    /// The webhook receiver's endpoint URL, e.g. `https://127.0.0.1:9003/hooks/demo`.
    pub webhooks: String,
    /// e.g. `http://127.0.0.1:9002/admin/webhooks`
    pub webhooks_admin: String,
    /// Where the local SMTP server keeps what it accepted.
    pub mail_folder: std::path::PathBuf,
    pub admin_token: String,
}

/// What happened, for printing and for assertions.
#[derive(Debug)]
pub struct Report {
    pub device_id: String,
    /// item code → watch id
    pub watches: Vec<(String, String)>,
    /// The device's history at the end (`GET /v1/notifications`), newest first.
    pub history: Vec<Value>,
    /// What the push service accepted and decrypted.
    pub received: Vec<Value>,
    /// The operator view of every outbox row (`GET /v1/admin/outbox`).
    pub outbox: Vec<Value>,
    /// C's delivery attempts (`GET /v1/admin/outbox/{id}/attempts`), first to last.
    pub attempts: Vec<Value>,
    /// D's webhook as received, and its endpoint's watch id.
    pub webhook: Value,
    pub webhook_watch: String,
    /// E's mail as received (its headers and text), and E's watch.
    pub mail: crate::mail::Read,
    pub mail_watch: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{what}: {detail}")]
    Step { what: String, detail: String },
    #[error("waited {0:?} for {1}")]
    Timeout(Duration, String),
}

fn step(what: &str) -> impl FnOnce(reqwest::Error) -> DemoError + '_ {
    move |e| DemoError::Step {
        what: what.to_owned(),
        detail: e.to_string(),
    }
}

struct Client {
    http: reqwest::Client,
    e: Endpoints,
}

impl Client {
    async fn call(
        &self,
        what: &str,
        method: Method,
        url: String,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Result<Value, DemoError> {
        let mut r = self.http.request(method, url);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.map_err(step(what))?;
        let status = resp.status();
        let text = resp.text().await.map_err(step(what))?;
        if !status.is_success() {
            return Err(DemoError::Step {
                what: what.to_owned(),
                detail: format!("HTTP {status}: {text}"),
            });
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn get(&self, what: &str, url: String, token: Option<&str>) -> Result<Value, DemoError> {
        self.call(what, Method::GET, url, token, None).await
    }

    async fn post(
        &self,
        what: &str,
        url: String,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Result<Value, DemoError> {
        self.call(what, Method::POST, url, token, body).await
    }

    async fn set_item(&self, code: &str, item: Value) -> Result<(), DemoError> {
        self.call(
            &format!("setting {code} in the catalog"),
            Method::PUT,
            format!("{}/{code}", self.e.catalog_admin),
            None,
            Some(item),
        )
        .await
        .map(|_| ())
    }

    async fn history(&self, token: &str) -> Result<Vec<Value>, DemoError> {
        let v = self
            .get(
                "reading the history",
                format!("{}/v1/notifications", self.e.api),
                Some(token),
            )
            .await?;
        Ok(v["items"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until the device's row for `watch` is in `status`; returns it.
    async fn wait_for(&self, token: &str, watch: &str, status: &str) -> Result<Value, DemoError> {
        self.wait_for_row(token, watch, status, false).await
    }

    /// Waits until the device's row for `watch`, a withdrawal or not, is in `status`.
    async fn wait_for_row(
        &self,
        token: &str,
        watch: &str,
        status: &str,
        withdrawal: bool,
    ) -> Result<Value, DemoError> {
        let limit = Duration::from_secs(45);
        let started = Instant::now();
        loop {
            let rows = self.history(token).await?;
            if let Some(row) = rows.iter().find(|r| {
                r["watch_id"] == watch
                    && r["status"] == status
                    && r["withdraws"].is_null() != withdrawal
            }) {
                return Ok(row.clone());
            }
            if started.elapsed() > limit {
                return Err(DemoError::Timeout(
                    limit,
                    format!("watch {watch} to have a {status} notification (history: {rows:?})"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// An amount of the demo's euros, without the code.
fn money(v: &Value) -> String {
    v.as_i64()
        .map(|c| tidings_domain::money::format(c, "", tidings_domain::money::Separators::POINT))
        .unwrap_or_else(|| "—".into())
}

/// Runs the scenario; `say` gets one line per thing that happened.
pub async fn run(e: Endpoints, mut say: impl FnMut(String)) -> Result<Report, DemoError> {
    let c = Client {
        http: reqwest::Client::new(),
        e,
    };
    for code in ["SKU-A", "SKU-B", "SKU-C"] {
        c.set_item(code, json!({"price": 1500})).await?;
    }
    let sub = c
        .post(
            "making a push subscription",
            format!("{}/subscriptions", c.e.push_admin),
            None,
            None,
        )
        .await?;
    let sub_id = sub["endpoint"]
        .as_str()
        .and_then(|e| e.rsplit('/').next())
        .unwrap_or_default()
        .to_owned();
    let device = c
        .post(
            "registering the device",
            format!("{}/v1/devices", c.e.api),
            None,
            Some(json!({"subscription": sub, "time_zone": "Europe/Berlin"})),
        )
        .await?;
    let token = device["token"].as_str().unwrap_or_default().to_owned();
    let device_id = device["device_id"].as_str().unwrap_or_default().to_owned();
    say(format!(
        "device {device_id} registered with a Web Push subscription"
    ));
    let mut watches = Vec::new();
    for code in ["SKU-A", "SKU-B", "SKU-C"] {
        let trigger = json!({"kind": "price_below", "threshold": 1200});
        let body = json!({"item_code": code, "triggers": [trigger]});
        let url = format!("{}/v1/watches", c.e.api);
        let w = c
            .post(&format!("watching {code}"), url, Some(&token), Some(body))
            .await?;
        watches.push((
            code.to_owned(),
            w["id"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    say("watching SKU-A, SKU-B and SKU-C for a price below 12.00 (all at 15.00 now)".into());
    let watch = |code: &str| {
        watches
            .iter()
            .find(|(c, _)| c == code)
            .map(|(_, w)| w.clone())
            .unwrap_or_default()
    };

    // A: a real drop.
    c.set_item("SKU-A", json!({"price": 999})).await?;
    say("SKU-A drops to 9.99".into());
    c.wait_for(&token, &watch("SKU-A"), "sent").await?;
    say("  → sent".into());

    // B: the detector sees 11.00, the re-check sees 15.00 again.
    c.set_item("SKU-B", json!({"price": 1500, "script": [1100]}))
        .await?;
    say("SKU-B drops to 11.00 and is back at 15.00 before the dispatcher sends".into());
    let b = c.wait_for(&token, &watch("SKU-B"), "dropped").await?;
    say(format!(
        "  → withheld ({}): detected {}, re-checked {}",
        b["reason"].as_str().unwrap_or("?"),
        money(&b["detected"]["price"]),
        money(&b["checked"]["price"])
    ));

    // C: the push service is briefly overloaded, then fails.
    c.post(
        "queueing a 429 and a 500",
        format!("{}/subscriptions/{sub_id}/answers", c.e.push_admin),
        None,
        Some(json!(["429:1", "server_error"])),
    )
    .await?;
    c.set_item("SKU-C", json!({"price": 1000})).await?;
    say("SKU-C drops to 10.00; the push service answers 429 (Retry-After: 1), then 500".into());
    let sent_c = c.wait_for(&token, &watch("SKU-C"), "sent").await?;
    say("  → retry, retry, then sent".into());
    let attempts = c
        .get(
            "reading C's attempts (operator)",
            format!(
                "{}/v1/admin/outbox/{}/attempts",
                c.e.operators,
                sent_c["id"].as_str().unwrap_or_default()
            ),
            Some(&c.e.admin_token),
        )
        .await?["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for a in &attempts {
        say(format!(
            "  attempt {}: {} {} {}",
            a["attempt"],
            a["outcome"].as_str().unwrap_or("?"),
            a["http_status"],
            a["push_host"].as_str().unwrap_or("?"),
        ));
    }

    // A again: back at 15.00 while its notification is current, which is withdrawn in place.
    c.set_item("SKU-A", json!({"price": 1500})).await?;
    say("SKU-A is back at 15.00 while its notification is current".into());
    let withdrawn = c
        .wait_for_row(&token, &watch("SKU-A"), "sent", true)
        .await?;
    say(format!(
        "  → withdrawn: a follow-up at {} replaces it (same tag and topic)",
        money(&withdrawn["sent"]["price"])
    ));

    let (webhook, webhook_watch) = webhook_step(&c, &mut say).await?;
    let (mail, mail_watch) = email_step(&c, &mut say).await?;

    let received = c
        .get(
            "reading what the push service received",
            format!("{}/received", c.e.push_admin),
            None,
        )
        .await?
        .as_array()
        .cloned()
        .unwrap_or_default();
    for r in &received {
        say(format!(
            "push service decrypted: {} — {}",
            r["body"]["title"].as_str().unwrap_or("?"),
            r["body"]["body"].as_str().unwrap_or("?")
        ));
    }
    let history = c.history(&token).await?;
    let outbox = c
        .get(
            "reading the outbox (operator)",
            format!("{}/v1/admin/outbox?device_id={device_id}", c.e.operators),
            Some(&c.e.admin_token),
        )
        .await?["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    Ok(Report {
        device_id,
        watches,
        history,
        received,
        outbox,
        attempts,
        webhook,
        webhook_watch,
        mail,
        mail_watch,
    })
}

/// The mails the local SMTP server accepted for `to`, once there are `n`.
async fn mails_to(c: &Client, to: &str, n: usize) -> Result<Vec<Vec<u8>>, DemoError> {
    let limit = Duration::from_secs(30);
    let started = Instant::now();
    loop {
        let got: Vec<Vec<u8>> = (crate::fake_smtp::received_in(&c.e.mail_folder).into_iter())
            .filter(|(rcpt, _)| rcpt == to)
            .map(|(_, m)| m)
            .collect();
        if got.len() >= n {
            return Ok(got);
        }
        if started.elapsed() > limit {
            return Err(DemoError::Timeout(limit, format!("mail {n} to {to}")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn mail_step(what: &str) -> impl FnOnce(String) -> DemoError + '_ {
    move |detail| DemoError::Step {
        what: what.to_owned(),
        detail,
    }
}

/// The sixth line: an email device confirms its address (the link mailed to it) and watches E;
/// E's drop arrives as a mail at the local SMTP server, DKIM-signed with the key whose record
/// `doctor` prints, and `dkimpy` verifies it. Returns the mail as read and E's watch.
async fn email_step(
    c: &Client,
    say: &mut impl FnMut(String),
) -> Result<(crate::mail::Read, String), DemoError> {
    use crate::mail::{Read, dkim_verdict, published};
    // An address of its own each run: a stack's database outlives runs, and an address is mailed
    // at most three confirmations a day (regression: the fourth demo in a day got a 429).
    let to = &format!(
        "reader-{}@mail.tidings.invalid",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    c.set_item("SKU-E", json!({"price": 1500})).await?;
    let device = c
        .post(
            "registering an email device",
            format!("{}/v1/devices", c.e.api),
            None,
            Some(json!({"email": to, "time_zone": "Europe/Berlin"})),
        )
        .await?;
    let token = device["token"].as_str().unwrap_or_default().to_owned();
    let confirmation = mails_to(c, to, 1).await?.remove(0);
    let read = Read::of(&confirmation).map_err(mail_step("reading the confirmation mail"))?;
    let link = read
        .link(&format!("{}/v1/email/confirm?t=", c.e.api))
        .ok_or_else(|| mail_step("finding the confirmation link")(read.text.clone()))?;
    let confirmed = c
        .http
        .post(&link)
        .send()
        .await
        .map_err(step("confirming"))?;
    say(format!(
        "an email device registers {to}; the link mailed to it confirms it ({})",
        confirmed.status()
    ));
    let trigger = json!({"kind": "price_below", "threshold": 1200});
    let w = c
        .post(
            "watching SKU-E by email",
            format!("{}/v1/watches", c.e.api),
            Some(&token),
            Some(json!({"item_code": "SKU-E", "triggers": [trigger]})),
        )
        .await?;
    let watch = w["id"].as_str().unwrap_or_default().to_owned();
    c.set_item("SKU-E", json!({"price": 949})).await?;
    say("SKU-E drops to 9.49".into());
    c.wait_for(&token, &watch, "sent").await?;
    let message = mails_to(c, to, 2).await?.remove(1);
    let doctor = c
        .get(
            "asking doctor for the DKIM record",
            format!("{}/v1/admin/doctor", c.e.operators),
            Some(&c.e.admin_token),
        )
        .await?;
    let (name, record) = (doctor["checks"].as_array().into_iter().flatten())
        .find(|check| check["name"] == "dkim")
        .and_then(|check| published(check["detail"].as_str().unwrap_or_default()))
        .ok_or_else(|| mail_step("reading the DKIM record")(doctor.to_string()))?;
    let verdict =
        dkim_verdict(&message, &name, &record).map_err(mail_step("verifying the mail's DKIM"))?;
    let read = Read::of(&message).map_err(mail_step("reading the mail"))?;
    say(format!(
        "  → mail \"{}\" received by the local SMTP server; DKIM (dkimpy, {name}): {verdict}",
        read.header("subject").unwrap_or("?")
    ));
    if verdict != "verified" {
        return Err(mail_step("verifying SKU-E's mail")(verdict));
    }
    Ok((read, watch))
}

/// The fifth line: an API client's webhook endpoint watches D; D's drop arrives as a signed
/// webhook carrying the re-checked value. Returns the webhook as received and D's watch.
async fn webhook_step(
    c: &Client,
    say: &mut impl FnMut(String),
) -> Result<(Value, String), DemoError> {
    c.set_item("SKU-D", json!({"price": 1500})).await?;
    let client = c
        .post(
            "issuing a client key (operator)",
            format!("{}/v1/admin/clients", c.e.operators),
            Some(&c.e.admin_token),
            Some(json!({"name": "demo shop backend"})),
        )
        .await?;
    let key = client["key"].as_str().unwrap_or_default().to_owned();
    let endpoint = c
        .post(
            "registering a webhook endpoint",
            format!("{}/v1/endpoints", c.e.api),
            Some(&key),
            Some(json!({"url": c.e.webhooks, "description": "demo"})),
        )
        .await?;
    let token = endpoint["token"].as_str().unwrap_or_default().to_owned();
    let secret = endpoint["secret"].as_str().unwrap_or_default().to_owned();
    let trigger = json!({"kind": "price_below", "threshold": 1200});
    let w = c
        .post(
            "watching SKU-D for the endpoint",
            format!("{}/v1/watches", c.e.api),
            Some(&token),
            Some(json!({"item_code": "SKU-D", "triggers": [trigger]})),
        )
        .await?;
    let watch = w["id"].as_str().unwrap_or_default().to_owned();
    say(format!(
        "an API client registers a webhook endpoint ({}) and watches SKU-D",
        c.e.webhooks
    ));
    c.set_item("SKU-D", json!({"price": 899})).await?;
    say("SKU-D drops to 8.99".into());
    c.wait_for(&token, &watch, "sent").await?;
    let received = c
        .get(
            "reading what the webhook receiver received",
            format!("{}/received", c.e.webhooks_admin),
            None,
        )
        .await?;
    let webhook = (received.as_array().into_iter().flatten())
        .find(|r| r["body"].as_str().is_some_and(|b| b.contains(&watch)))
        .cloned()
        .ok_or_else(|| DemoError::Step {
            what: "finding SKU-D's webhook".into(),
            detail: format!("not among {received}"),
        })?;
    let verified = verify(&webhook, &secret);
    let body: Value =
        serde_json::from_str(webhook["body"].as_str().unwrap_or("null")).unwrap_or(Value::Null);
    say(format!(
        "  → webhook {}: {}, re-checked {}, signature {}",
        webhook["webhook-id"].as_str().unwrap_or("?"),
        body["type"].as_str().unwrap_or("?"),
        money(&body["data"]["checked"]["price"]),
        if verified { "verified" } else { "NOT verified" }
    ));
    if !verified {
        return Err(DemoError::Step {
            what: "verifying SKU-D's webhook".into(),
            detail: "its signature does not verify with the endpoint's secret".into(),
        });
    }
    Ok((webhook, watch))
}

/// Whether the webhook as received verifies with `secret` (Standard Webhooks).
fn verify(webhook: &Value, secret: &str) -> bool {
    use tidings_signatures::{Headers, Secret, verify};
    let Ok(secret) = Secret::parse(secret) else {
        return false;
    };
    let headers = Headers {
        id: webhook["webhook-id"].as_str(),
        timestamp: webhook["webhook-timestamp"].as_str(),
        signature: webhook["webhook-signature"].as_str(),
    };
    let body = webhook["body"].as_str().unwrap_or_default();
    verify(
        &[&[secret]],
        headers,
        body.as_bytes(),
        chrono::Utc::now().timestamp(),
    )
    .is_ok()
}

/// The outbox rows as a table.
pub fn table(rows: &[Value]) -> String {
    let mut out = format!(
        "{:<8} {:<11} {:<8} {:<15} {:>8} {:>9} {:>8}  {}\n",
        "item", "trigger", "status", "reason", "attempts", "detected", "sent", "outbox id"
    );
    let mut rows = rows.to_vec();
    rows.reverse();
    for r in rows {
        out.push_str(&format!(
            "{:<8} {:<11} {:<8} {:<15} {:>8} {:>9} {:>8}  {}\n",
            r["item_code"].as_str().unwrap_or("?"),
            if r["withdraws"].is_string() {
                "withdrawal"
            } else {
                r["trigger"]["kind"].as_str().unwrap_or("?")
            },
            r["status"].as_str().unwrap_or("?"),
            r["reason"].as_str().unwrap_or("—"),
            r["attempt"].as_i64().unwrap_or(0),
            money(&r["detected"]["price"]),
            money(&r["sent"]["price"]),
            r["id"].as_str().unwrap_or("?"),
        ));
    }
    out
}
