//! `GET /v1/admin/doctor`: a deployment checked end to end from where the api stands, each check
//! saying what is wrong in words an operator can act on:
//!
//! - the database has the schema this build needs, and no due row has waited too long;
//! - the api reaches NATS; every stream exists with the configuration the workers give it;
//! - every worker's durable consumer exists with the configuration it creates, and is not
//!   lagging far behind;
//! - the VAPID key pair is one: every pusher answering the roll call signs with the private key
//!   whose public half the api hands to browsers;
//! - where email is on: the relay greets, secures and logs in the api, and the DKIM key reads,
//!   with the DNS record that publishes it.

use crate::AppState;
use crate::auth::Operator;
use crate::extract::ApiQuery;
use crate::problem::{ApiError, Unauthorized};
use async_nats::jetstream::consumer::AckPolicy;
use async_nats::jetstream::stream::Config as StreamConfig;
use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use std::time::Duration;
use tidings_api_types::doctor::{Check, Diagnosis};
use tidings_bus::streams::{CONSUMERS, stream_config};
use tidings_domain::subjects::{StreamKind, Subjects};
use tidings_sealing::SecretKeys;
use utoipa::IntoParams;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DoctorQuery {
    /// Messages a consumer may have waiting before it counts as lagging (default 10,000).
    #[param(minimum = 0, maximum = 1_000_000_000)]
    pub max_lag: Option<u64>,
    /// Seconds the oldest due row may have waited (default 300).
    #[param(minimum = 0, maximum = 1_000_000_000)]
    pub max_due_age: Option<u64>,
}

fn check(name: impl Into<String>, ok: bool, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        ok,
        detail: detail.into(),
    }
}

/// The relay answers (a connection greeted, secured and logged in, then closed), and the DKIM
/// record to publish. (The pushers' and dispatchers' own relay and key are theirs: set alike.)
async fn email(app: &AppState, checks: &mut Vec<Check>) {
    let Some(mail) = app.settings.mail.as_deref() else {
        return;
    };
    let relay = mail.relay.address();
    checks.push(match mail.relay.unreachable().await {
        None => check(
            "email relay",
            true,
            format!("{relay} greets, secures and logs in"),
        ),
        Some(why) => check(
            "email relay",
            false,
            format!("{relay}: {why} (check TIDINGS_SMTP_HOST, _PORT, _SECURITY and the login)"),
        ),
    });
    let (name, record) = mail.sender.dkim.dns_record();
    checks.push(check(
        "dkim",
        true,
        format!("publish TXT {name} \"{record}\" (docs/email.md: also SPF and DMARC)"),
    ));
}

async fn database(app: &AppState, max_due_age: u64, checks: &mut Vec<Check>) {
    match tidings_store::schema::check(&app.pool).await {
        Ok(found) => checks.push(check(
            "schema",
            true,
            format!(
                "migration {found} (this build needs {})",
                tidings_store::schema::needed()
            ),
        )),
        Err(e) => {
            checks.push(check("schema", false, e.to_string()));
            return;
        }
    }
    let due = tidings_store::backlog::due(&app.pool).await;
    checks.push(match due.map(|d| (d.rows, d.oldest_seconds)) {
        Ok((n, age)) if age <= max_due_age as f64 => check(
            "outbox backlog",
            true,
            format!("{n} rows due, the oldest waiting {age:.0} s"),
        ),
        Ok((n, age)) => check(
            "outbox backlog",
            false,
            format!(
                "{n} rows due, the oldest waiting {age:.0} s (more than {max_due_age} s): is a \
                 dispatcher running and keeping up? (docs/runbooks.md, TidingsOutboxBacklog)"
            ),
        ),
        Err(e) => check("outbox backlog", false, format!("reading the outbox: {e}")),
    });
    checks.push(
        match tidings_store::endpoints::sealing_keys_in_use(&app.pool).await {
            Ok(in_use) => sealing(app.settings.webhook_secret_keys.as_deref(), &in_use),
            Err(e) => check("webhook secrets", false, format!("reading them: {e}")),
        },
    );
    checks.push(webhook_endpoints(app).await);
}

/// Webhook endpoints whose breaker is open or paced, naming the longest failing: a client's
/// receiver, not this deployment, so it is said, not failed.
async fn webhook_endpoints(app: &AppState) -> Check {
    let read = async {
        let health = tidings_store::subscriptions::unhealthy(&app.pool, 1).await?;
        let opened = tidings_store::endpoints::opened(&app.pool, 5).await?;
        Ok::<_, sqlx::Error>((health, opened))
    };
    let (health, opened) = match read.await {
        Ok(found) => found,
        Err(e) => return check("webhook endpoints", false, format!("reading them: {e}")),
    };
    let mut detail = format!(
        "{} breakers open, {} half-open (probing), {} endpoints paced",
        health.open, health.half_open, health.paced
    );
    for e in &opened {
        // Its authority only: the path may carry the client's own tokens.
        let host = (e.url.split("://").nth(1))
            .and_then(|rest| rest.split(['/', '?', '#']).next())
            .unwrap_or_default();
        let since = e.failing_since.map_or("?".into(), |at| at.to_rfc3339());
        detail.push_str(&format!(
            "; subscription {} ({host}) failing since {since}",
            e.subscription_id
        ));
    }
    check("webhook endpoints", true, detail)
}

/// Whether every stored webhook secret opens with the api's keys (the dispatcher's are the
/// same), and what is left to seal under the first.
fn sealing(keys: Option<&SecretKeys>, in_use: &[(Option<String>, i64)]) -> Check {
    let ids = keys.map(SecretKeys::ids).unwrap_or_default();
    let count = |pick: &dyn Fn(Option<&str>) -> bool| -> i64 {
        (in_use.iter())
            .filter(|(id, _)| pick(id.as_deref()))
            .map(|(_, n)| n)
            .sum()
    };
    let unknown: Vec<&str> = (in_use.iter())
        .filter_map(|(id, _)| id.as_deref())
        .filter(|id| !ids.contains(id))
        .collect();
    let total = count(&|_| true);
    let plain = count(&|id| id.is_none());
    let behind = count(&|id| id.is_some_and(|id| ids.first() != Some(&id)));
    if !unknown.is_empty() {
        return check(
            "webhook secrets",
            false,
            format!(
                "sealed under keys {unknown:?} that TIDINGS_WEBHOOK_SECRET_KEYS does not hold: \
                 their webhooks wait, never sent unsigned; give those keys back (docs/security.md)"
            ),
        );
    }
    if keys.is_some() && plain > 0 {
        return check(
            "webhook secrets",
            false,
            format!(
                "{plain} of {total} stored as given although keys are given: they do not open, \
                 and their webhooks wait; run `tidings-api reseal`"
            ),
        );
    }
    let detail = match (keys, plain, behind) {
        (None, 0, _) => format!("{total} stored"),
        (None, _, _) => format!(
            "{plain} of {total} stored as given: set TIDINGS_WEBHOOK_SECRET_KEYS to seal them"
        ),
        (Some(_), 0, 0) => format!("{total} sealed under the first key"),
        (Some(_), _, _) => format!(
            "{behind} of {total} not sealed under the first key: run `tidings-api reseal` \
             before dropping a key"
        ),
    };
    check("webhook secrets", true, detail)
}

async fn streams(
    app: &AppState,
    js: &async_nats::jetstream::Context,
    max_lag: u64,
    checks: &mut Vec<Check>,
) {
    let subjects = &app.settings.subjects;
    for kind in StreamKind::ALL {
        let want = stream_config(subjects, kind, &app.settings.streams);
        checks.push(stream(js, kind, &want).await);
    }
    for (kind, durable) in CONSUMERS {
        checks.push(consumer(js, subjects, kind, durable, max_lag).await);
    }
}

/// Whether stream `kind` is there as this build configures it (`want`).
async fn stream(
    js: &async_nats::jetstream::Context,
    kind: StreamKind,
    want: &StreamConfig,
) -> Check {
    let name = format!("stream {}", kind.as_str());
    let info = match js.get_stream(&want.name).await {
        Ok(mut s) => match s.info().await {
            Ok(i) => i.clone(),
            Err(e) => return check(name, false, format!("{}: {e}", want.name)),
        },
        Err(e) => {
            return check(
                name,
                false,
                format!(
                    "{} is missing ({e}): start a worker (it creates the streams) and check \
                     TIDINGS_PREFIX matches",
                    want.name
                ),
            );
        }
    };
    let wrong = stream_drift(&info.config, want);
    if wrong.is_empty() {
        let detail = format!(
            "{} messages, {} bytes",
            info.state.messages, info.state.bytes
        );
        check(name, true, detail)
    } else {
        check(name, false, format!("{}: {}", want.name, wrong.join("; ")))
    }
}

/// How a stream's configuration differs from what this build makes.
fn stream_drift(got: &StreamConfig, want: &StreamConfig) -> Vec<String> {
    let mut wrong = Vec::new();
    macro_rules! differs {
        ($field:ident, $what:literal) => {
            if got.$field != want.$field {
                wrong.push(format!(
                    concat!($what, " {:?}, expected {:?}"),
                    got.$field, want.$field
                ));
            }
        };
    }
    differs!(subjects, "subjects");
    differs!(retention, "retention");
    differs!(storage, "storage");
    differs!(num_replicas, "replicas (TIDINGS_STREAM_REPLICAS):");
    differs!(
        duplicate_window,
        "duplicate window (TIDINGS_DUPLICATE_WINDOW):"
    );
    differs!(max_age, "max age");
    wrong
}

/// Whether consumer `durable` is there as its service makes it, and keeping up.
async fn consumer(
    js: &async_nats::jetstream::Context,
    subjects: &Subjects,
    kind: StreamKind,
    durable: &str,
    max_lag: u64,
) -> Check {
    let stream = subjects.stream(kind);
    let name = format!("consumer {durable}");
    let info = match js.get_stream_no_info(&stream).await {
        Ok(s) => s.consumer_info(durable).await,
        Err(e) => return check(name, false, format!("stream {stream}: {e}")),
    };
    let info = match info {
        Ok(i) => i,
        Err(e) => {
            return check(
                name,
                false,
                format!(
                    "{durable} on {stream} is missing ({e}): is its service running and ready?"
                ),
            );
        }
    };
    let mut wrong = Vec::new();
    let c = &info.config;
    if c.ack_policy != AckPolicy::Explicit {
        wrong.push(format!("ack policy {:?}, expected Explicit", c.ack_policy));
    }
    if c.max_deliver != -1 {
        wrong.push(format!("max deliver {}, expected unlimited", c.max_deliver));
    }
    // The whole stream, or one channel's subject of it (the pusher consumes per channel).
    let within = format!("{}.{}.", subjects.prefix(), kind.as_str());
    if !c.filter_subject.starts_with(&within) {
        wrong.push(format!(
            "filter {:?}, expected {:?} or one channel's subject",
            c.filter_subject,
            subjects.all(kind)
        ));
    }
    // `usize` fits `u64` on every target this builds for.
    let waiting = info.num_pending + u64::try_from(info.num_ack_pending).unwrap_or(0);
    if waiting > max_lag {
        wrong.push(format!(
            "{} waiting and {} unacknowledged (more than {max_lag}): its service is not keeping up",
            info.num_pending, info.num_ack_pending
        ));
    }
    if wrong.is_empty() {
        let detail = format!(
            "{} waiting, {} unacknowledged",
            info.num_pending, info.num_ack_pending
        );
        check(name, true, detail)
    } else {
        check(
            name,
            false,
            format!("{durable} on {stream}: {}", wrong.join("; ")),
        )
    }
}

async fn vapid(app: &AppState, client: &async_nats::Client, checks: &mut Vec<Check>) {
    let Some(api_key) = app.settings.vapid_public_key.clone() else {
        checks.push(check(
            "vapid",
            false,
            "the api has no TIDINGS_VAPID_PUBLIC_KEY: browsers cannot subscribe",
        ));
        return;
    };
    let present =
        tidings_bus::roll_call::call(client, &app.settings.subjects, Duration::from_millis(1500))
            .await;
    checks.push(match present {
        Err(e) => check("vapid", false, e.to_string()),
        Ok(p) if p.is_empty() => check(
            "vapid",
            false,
            "no pusher answered the roll call within 1.5 s: is a pusher running (and allowed to \
             subscribe to the roll call, docs/security.md)?",
        ),
        Ok(p) => {
            let wrong: Vec<String> = p
                .iter()
                .filter(|x| x.vapid_public_key != api_key)
                .map(|x| {
                    format!(
                        "pusher {} signs with the key whose public half is {}, the api hands out {}",
                        x.instance, x.vapid_public_key, api_key
                    )
                })
                .collect();
            if wrong.is_empty() {
                check(
                    "vapid",
                    true,
                    format!("{} pusher(s) sign with the api's key pair", p.len()),
                )
            } else {
                check(
                    "vapid",
                    false,
                    format!(
                        "{}: push services will answer 401/403; give the api and every pusher \
                         the same pair (tidings-pusher vapid-keygen)",
                        wrong.join("; ")
                    ),
                )
            }
        }
    });
}

#[utoipa::path(
    get, path = "/v1/admin/doctor", tag = "operators",
    params(DoctorQuery),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Every check with what it found; `ok` is false when any failed", body = Diagnosis),
        (status = 400, description = "A bound that is not a whole number up to 1,000,000,000", body = crate::problem::Problem, content_type = "application/problem+json"),
        Unauthorized,
    )
)]
pub async fn doctor(
    State(app): State<AppState>,
    _: Operator,
    ApiQuery(q): ApiQuery<DoctorQuery>,
) -> Result<Json<Diagnosis>, ApiError> {
    const MAX: u64 = 1_000_000_000;
    for (name, value) in [("max_lag", q.max_lag), ("max_due_age", q.max_due_age)] {
        if value.is_some_and(|v| v > MAX) {
            return Err(ApiError::BadRequest(format!(
                "{name} must be at most {MAX}"
            )));
        }
    }
    let mut checks = Vec::new();
    database(&app, q.max_due_age.unwrap_or(300), &mut checks).await;
    email(&app, &mut checks).await;
    match app.settings.bus.clone() {
        None => checks.push(check(
            "nats",
            false,
            "the api is not connected to NATS, so streams, consumers and the pushers' VAPID keys \
             cannot be checked: set TIDINGS_API_NATS=true with the api's NATS user",
        )),
        Some(client) => {
            let state = client.connection_state();
            if state != async_nats::connection::State::Connected {
                checks.push(check(
                    "nats",
                    false,
                    format!(
                        "the api's NATS connection is {state:?}: check NATS_URL and its credentials"
                    ),
                ));
            } else {
                checks.push(check("nats", true, "connected"));
                let js = async_nats::jetstream::new(client.clone());
                streams(&app, &js, q.max_lag.unwrap_or(10_000), &mut checks).await;
                vapid(&app, &client, &mut checks).await;
            }
        }
    }
    Ok(Json(Diagnosis {
        ok: checks.iter().all(|c| c.ok),
        checks,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key the api lacks fails; secrets stored as given, or under a key that is not first,
    /// say what to run; all sealed under the first is fine.
    #[test]
    fn webhook_secrets_are_checked_against_the_apis_keys() {
        const OLD: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        const NEW: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
        let parse = |text: &str| SecretKeys::parse(text).unwrap_or_else(|e| unreachable!("{e}"));
        let (old, both) = (parse(OLD), parse(&format!("{NEW}\n{OLD}")));
        let (old_id, new_id) = (both.ids()[1].to_owned(), both.ids()[0].to_owned());
        let found = |keys: Option<&SecretKeys>, in_use: &[(Option<&str>, i64)]| {
            let in_use: Vec<(Option<String>, i64)> = (in_use.iter())
                .map(|(id, n)| (id.map(str::to_owned), *n))
                .collect();
            let c = sealing(keys, &in_use);
            (c.ok, c.detail)
        };
        let (ok, detail) = found(Some(&old), &[(Some(&new_id), 2)]);
        assert!(!ok && detail.contains(&new_id), "{detail}");
        assert!(
            !detail.contains("  "),
            "one sentence, not a source line's indent: {detail}"
        );
        let (ok, detail) = found(None, &[(None, 3), (Some(&old_id), 1)]);
        assert!(!ok, "no keys, yet one sealed: {detail}");
        let (ok, detail) = found(None, &[(None, 3)]);
        assert!(
            ok && detail.contains("set TIDINGS_WEBHOOK_SECRET_KEYS"),
            "{detail}"
        );
        // Regression: a secret stored as given passed while keys were given; it no longer
        // opens then (its webhooks wait), so doctor fails and names the fix.
        let (ok, detail) = found(
            Some(&both),
            &[(None, 1), (Some(&old_id), 2), (Some(&new_id), 4)],
        );
        assert!(
            !ok && detail.starts_with("1 of 7") && detail.contains("reseal"),
            "{detail}"
        );
        let (ok, detail) = found(Some(&both), &[(Some(&old_id), 2), (Some(&new_id), 4)]);
        assert!(
            ok && detail.starts_with("2 of 6") && detail.contains("reseal"),
            "{detail}"
        );
        assert!(!detail.contains("  "), "{detail}");
        let (ok, detail) = found(Some(&both), &[(Some(&new_id), 4)]);
        assert_eq!(
            (ok, detail.as_str()),
            (true, "4 sealed under the first key")
        );
    }

    #[test]
    fn a_stream_made_otherwise_is_named_field_by_field() {
        let want = StreamConfig {
            name: "T_ENQUEUE".into(),
            subjects: vec!["t.enqueue.>".into()],
            num_replicas: 3,
            max_age: Duration::from_secs(3600),
            ..StreamConfig::default()
        };
        assert!(stream_drift(&want, &want).is_empty());
        let got = StreamConfig {
            num_replicas: 1,
            max_age: Duration::from_secs(60),
            ..want.clone()
        };
        assert_eq!(
            stream_drift(&got, &want),
            [
                "replicas (TIDINGS_STREAM_REPLICAS): 1, expected 3",
                "max age 60s, expected 3600s"
            ]
        );
    }
}
