//! What each service may publish and subscribe to on NATS, and the nats-server `authorization`
//! block that grants exactly that (docs/security.md).
//!
//! A service needs its own subjects (the detector publishes enqueue requests; the dispatcher
//! consumes enqueue requests and results and publishes push requests; the pusher consumes push
//! requests and publishes results), dead letters for what it consumes, the JetStream API calls
//! behind those (stream and consumer info, pulling, acknowledging; every service creates the
//! streams it finds missing at start-up), and the replies to its requests, which arrive on an
//! inbox of its own ([`inbox_prefix`]) so one service cannot read another's replies.
//!
//! The prefix may be `*` (any prefix): the local stack's server is shared by tests that each
//! use a prefix of their own. A deployment names its prefix.

use std::fmt::Write as _;
use tidings_domain::subjects::StreamKind;

/// A service that talks to NATS. The api does so only for its operator routes (dead letters,
/// `doctor`), and only reads, except a redrive of a dead letter to where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    Detector,
    Dispatcher,
    Pusher,
    Api,
}

impl Service {
    pub const ALL: [Service; 4] = [
        Service::Detector,
        Service::Dispatcher,
        Service::Pusher,
        Service::Api,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Service::Detector => "detector",
            Service::Dispatcher => "dispatcher",
            Service::Pusher => "pusher",
            Service::Api => "api",
        }
    }

    /// The service a binary name such as `tidings-pusher` runs, if any.
    pub fn of_binary(binary: &str) -> Option<Service> {
        let name = binary.strip_prefix("tidings-").unwrap_or(binary);
        Service::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// Where replies to a service's requests arrive: `_INBOX_<service>.<id>`. Any other binary
/// (a test, a tool) keeps the default `_INBOX`.
pub fn inbox_prefix(binary: &str) -> Option<String> {
    Service::of_binary(binary).map(|s| format!("_INBOX_{}", s.name()))
}

/// Subjects a user may publish to and subscribe to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
    /// May answer a request it received (on the requester's inbox, once).
    pub allow_responses: bool,
}

fn stream(prefix: &str, kind: StreamKind) -> String {
    if prefix == "*" {
        "*".to_owned()
    } else {
        format!("{prefix}_{}", kind.as_str())
    }
}

/// The JetStream API calls of a durable pull consumer on `kind`'s stream.
fn consume(prefix: &str, kind: StreamKind, publish: &mut Vec<String>) {
    let s = stream(prefix, kind);
    for call in ["CREATE", "DURABLE.CREATE", "INFO", "MSG.NEXT"] {
        publish.push(format!("$JS.API.CONSUMER.{call}.{s}.>"));
    }
    publish.push(format!("$JS.ACK.{s}.>"));
}

/// Who does what to the delivery log's bucket (`crate::delivered`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum LogUse {
    /// The dispatcher makes it (with the streams), and reads it.
    Own,
    /// The pusher reads and writes its keys, but cannot make, reshape or delete its stream.
    Write,
}

/// The delivery log's bucket (`crate::delivered`).
fn delivery_log(prefix: &str, using: LogUse, publish: &mut Vec<String>) {
    let bucket = if prefix == "*" {
        "*".to_owned()
    } else {
        format!("{prefix}_{}", crate::delivered::BUCKET)
    };
    let stream = if prefix == "*" {
        "*".to_owned()
    } else {
        format!("KV_{bucket}")
    };
    let calls: &[&str] = match using {
        LogUse::Own => &["INFO", "CREATE", "UPDATE", "MSG.GET"],
        LogUse::Write => &["INFO", "MSG.GET"],
    };
    for call in calls {
        publish.push(format!("$JS.API.STREAM.{call}.{stream}"));
    }
    // A bucket an older Tidings kept in memory is replaced (`crate::delivered`). Not under the
    // prefix `*`, where the stream's name would be any stream's.
    if using == LogUse::Own && prefix != "*" {
        publish.push(format!("$JS.API.STREAM.DELETE.{stream}"));
    }
    publish.push(format!("$JS.API.DIRECT.GET.{stream}.>"));
    if using == LogUse::Write {
        publish.push(format!("$KV.{bucket}.>"));
    }
}

/// What `service` needs under `prefix` (`*`: any prefix).
pub fn permissions(service: Service, prefix: &str) -> Permissions {
    let mut publish = vec!["$JS.API.INFO".to_owned()];
    for kind in StreamKind::ALL {
        let s = stream(prefix, kind);
        publish.push(format!("$JS.API.STREAM.INFO.{s}"));
        // Only the dispatcher creates the streams; the others wait for them (and the
        // internet-facing pusher can neither make nor reshape one).
        if service == Service::Dispatcher {
            publish.push(format!("$JS.API.STREAM.CREATE.{s}"));
        }
    }
    let subject = |kind: StreamKind| format!("{prefix}.{}.>", kind.as_str());
    let mut subscribe = vec![format!("_INBOX_{}.>", service.name())];
    let roll_call = format!("{prefix}.{}", crate::roll_call::SUBJECT);
    match service {
        Service::Detector => {
            publish.push(subject(StreamKind::Enqueue));
            // Change hints, from the api or producers inside the cluster.
            subscribe.push(format!("{prefix}.hints.>"));
            // How much waits for ingest: scans wait while dispatch is behind.
            publish.push(format!(
                "$JS.API.CONSUMER.INFO.{}.{}",
                stream(prefix, StreamKind::Enqueue),
                crate::streams::consumer_of(StreamKind::Enqueue)
            ));
        }
        Service::Dispatcher => {
            publish.push(subject(StreamKind::Push));
            publish.push(subject(StreamKind::Dlq));
            for kind in [StreamKind::Enqueue, StreamKind::Result] {
                consume(prefix, kind, &mut publish);
                // Acknowledged messages are purged in bulk (`crate::consume`).
                publish.push(format!("$JS.API.STREAM.PURGE.{}", stream(prefix, kind)));
                // A dead letter redriven (`crate::redrive`) goes back where it came from.
                publish.push(subject(kind));
            }
            let dlq = stream(prefix, StreamKind::Dlq);
            publish.push(format!("$JS.API.STREAM.MSG.GET.{dlq}"));
            publish.push(format!("$JS.API.STREAM.MSG.DELETE.{dlq}"));
            subscribe.push(format!("{prefix}.{}", crate::redrive::SUBJECT));
            delivery_log(prefix, LogUse::Own, &mut publish);
        }
        Service::Pusher => {
            publish.push(subject(StreamKind::Result));
            publish.push(subject(StreamKind::Dlq));
            consume(prefix, StreamKind::Push, &mut publish);
            delivery_log(prefix, LogUse::Write, &mut publish);
            // Answers the api's roll call (its VAPID key, for `doctor`).
            subscribe.push(roll_call.clone());
        }
        Service::Api => {
            // `doctor`: the workers' consumers, looked at.
            for kind in [StreamKind::Enqueue, StreamKind::Result, StreamKind::Push] {
                publish.push(format!("$JS.API.CONSUMER.INFO.{}.>", stream(prefix, kind)));
            }
            // Dead letters: read and delete. A redrive is asked of a dispatcher
            // (`crate::redrive`): the api publishes nothing to the pipeline's streams.
            let dlq = stream(prefix, StreamKind::Dlq);
            publish.push(format!("$JS.API.STREAM.MSG.GET.{dlq}"));
            publish.push(format!("$JS.API.STREAM.MSG.DELETE.{dlq}"));
            publish.push(format!("{prefix}.{}", crate::redrive::SUBJECT));
            publish.push(roll_call);
            // Change hints that `POST /v1/items/changed` verified.
            publish.push(format!("{prefix}.hints.>"));
        }
    }
    // With the prefix `*` several entries become one.
    let mut seen = std::collections::HashSet::new();
    publish.retain(|p| seen.insert(p.clone()));
    Permissions {
        publish,
        subscribe,
        // The pusher answers the roll call, the dispatcher redrive asks.
        allow_responses: matches!(service, Service::Pusher | Service::Dispatcher),
    }
}

fn quoted(list: &[String]) -> String {
    list.iter()
        .map(|s| format!("\n        \"{s}\""))
        .collect::<Vec<_>>()
        .join(",")
}

/// A nats-server configuration that grants each service's user (name, password) only
/// [`permissions`] under `prefix`. A password is written as given: a quoted string, or a
/// `$VARIABLE` nats-server reads from its environment. `admin`, if given (user, password), may do
/// anything and is the user of a client that sends no credentials: the local stack's tests and
/// tools.
pub fn server_config(
    prefix: &str,
    users: &[(Service, &str, &str)],
    admin: Option<(&str, &str)>,
) -> String {
    let mut out = String::from("authorization {\n  users = [\n");
    for (service, user, password) in users {
        let p = permissions(*service, prefix);
        let _ = writeln!(
            out,
            "    {{ user: \"{user}\", password: {password}, permissions: {{"
        );
        let _ = writeln!(
            out,
            "      publish: {{ allow: [{}\n      ] }}",
            quoted(&p.publish)
        );
        let _ = writeln!(
            out,
            "      subscribe: {{ allow: [{}\n      ] }}",
            quoted(&p.subscribe)
        );
        if p.allow_responses {
            out.push_str("      allow_responses: true\n");
        }
        out.push_str("    } }\n");
    }
    if let Some((user, password)) = admin {
        let _ = writeln!(out, "    {{ user: \"{user}\", password: {password} }}");
    }
    out.push_str("  ]\n}\n");
    if let Some((user, _)) = admin {
        let _ = writeln!(out, "no_auth_user: \"{user}\"");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidings_domain::Channel;
    use tidings_domain::subjects::Subjects;

    /// The configurations checked in under `deploy/`, from [`server_config`]: (path from the
    /// repository's root, prefix, whether the stack's admin user is in it). Each service's password
    /// is `$TIDINGS_NATS_<SERVICE>_PASSWORD` from the server's environment.
    const CHECKED_IN: [(&str, &str, bool); 2] = [
        ("deploy/local/nats-users.conf", "*", true),
        ("deploy/k8s/overlays/dev/nats-users.conf", "tidings", false),
    ];

    /// The text of a checked-in configuration (see [`CHECKED_IN`]).
    fn checked_in_config(prefix: &str, admin: bool) -> String {
        let vars: Vec<(Service, String)> = Service::ALL
            .iter()
            .map(|s| {
                (
                    *s,
                    format!("$TIDINGS_NATS_{}_PASSWORD", s.name().to_uppercase()),
                )
            })
            .collect();
        let users: Vec<(Service, &str, &str)> = vars
            .iter()
            .map(|(s, v)| (*s, s.name(), v.as_str()))
            .collect();
        let header = format!(
            "# Generated from tidings_bus::permissions (its tests check this file; TIDINGS_BLESS=1\n\
             # rewrites it). Each service's user may publish and subscribe only to what it needs under\n\
             # the prefix {prefix:?}; the passwords come from the server's environment.\n"
        );
        header
            + &server_config(
                prefix,
                &users,
                admin.then_some(("admin", "$TIDINGS_NATS_ADMIN_PASSWORD")),
            )
    }

    /// Whether `subject` matches the NATS subject pattern `pattern` (`*` one token, `>` the rest).
    fn matches(pattern: &str, subject: &str) -> bool {
        let mut p = pattern.split('.');
        let mut s = subject.split('.');
        loop {
            match (p.next(), s.next()) {
                (Some(">"), Some(_)) => return true,
                (Some("*"), Some(_)) => {}
                (Some(a), Some(b)) if a == b => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }

    fn may_publish(service: Service, prefix: &str, subject: &str) -> bool {
        permissions(service, prefix)
            .publish
            .iter()
            .any(|p| matches(p, subject))
    }

    #[test]
    fn subject_patterns_match_whole_tokens() {
        assert!(matches("a.*.c", "a.b.c"));
        assert!(matches("a.>", "a.b.c"));
        assert!(!matches("a.>", "a"));
        assert!(!matches("a.*", "a.b.c"));
        assert!(!matches("a.b", "a.bc"));
    }

    #[test]
    fn each_service_publishes_only_its_own_messages() {
        for prefix in ["tidings", "*"] {
            let s = Subjects::new("tidings").unwrap();
            let enqueue = s.subject(StreamKind::Enqueue, Channel::WebPush);
            let push = s.subject(StreamKind::Push, Channel::WebPush);
            let result = s.subject(StreamKind::Result, Channel::WebPush);
            let dlq = s.dlq(StreamKind::Push);
            use Service::*;
            // The dispatcher may redrive a dead enqueue request or result, never a push request;
            // the api publishes none of them.
            let table = [
                (Detector, [true, false, false, false]),
                (Dispatcher, [true, true, true, true]),
                (Pusher, [false, false, true, true]),
                (Api, [false, false, false, false]),
            ];
            for (service, allowed) in table {
                for (subject, allowed) in [&enqueue, &push, &result, &dlq].into_iter().zip(allowed)
                {
                    assert_eq!(
                        may_publish(service, prefix, subject),
                        allowed,
                        "{service:?} (prefix {prefix}) publishing {subject}"
                    );
                }
            }
        }
    }

    #[test]
    fn only_the_consumer_of_a_stream_may_pull_ack_or_purge_it() {
        let s = Subjects::new("tidings").unwrap();
        let next = |kind| format!("$JS.API.CONSUMER.MSG.NEXT.{}.c", s.stream(kind));
        let ack = |kind| format!("$JS.ACK.{}.c.1.1.1.1.0", s.stream(kind));
        let purge = |kind| format!("$JS.API.STREAM.PURGE.{}", s.stream(kind));
        use Service::*;
        for (service, consumes) in [
            (Detector, vec![]),
            (Dispatcher, vec![StreamKind::Enqueue, StreamKind::Result]),
            (Pusher, vec![StreamKind::Push]),
            (Api, vec![]),
        ] {
            for kind in StreamKind::ALL {
                let own = consumes.contains(&kind);
                assert_eq!(
                    may_publish(service, "tidings", &next(kind)),
                    own,
                    "{service:?} {kind:?}"
                );
                assert_eq!(
                    may_publish(service, "tidings", &ack(kind)),
                    own,
                    "{service:?} {kind:?}"
                );
                let purges = own && kind != StreamKind::Push;
                assert_eq!(may_publish(service, "tidings", &purge(kind)), purges);
            }
            // Nobody deletes a stream of the pipeline.
            assert!(!may_publish(
                service,
                "*",
                "$JS.API.STREAM.DELETE.tidings_enqueue"
            ));
        }
    }

    #[test]
    fn the_detector_may_read_only_the_ingest_consumers_backlog() {
        let info = |stream: &str, consumer: &str| {
            format!("$JS.API.CONSUMER.INFO.tidings_{stream}.{consumer}")
        };
        for prefix in ["tidings", "*"] {
            let d = |subject: &str| may_publish(Service::Detector, prefix, subject);
            assert!(d(&info("enqueue", "dispatcher-ingest")), "{prefix}");
            assert!(!d(&info("enqueue", "other")), "{prefix}");
            assert!(!d(&info("push", "pusher")), "{prefix}");
            assert!(!d(&info("result", "dispatcher-results")), "{prefix}");
            assert!(!d(
                "$JS.API.CONSUMER.CREATE.tidings_enqueue.dispatcher-ingest"
            ));
        }
    }

    #[test]
    fn only_the_pusher_writes_the_delivery_log_and_only_the_dispatcher_shapes_it() {
        let key = "$KV.tidings_delivered.0192";
        for prefix in ["tidings", "*"] {
            for service in Service::ALL {
                let p = |subject: &str| may_publish(service, prefix, subject);
                assert_eq!(p(key), service == Service::Pusher, "{service:?}");
                for call in ["CREATE", "UPDATE", "DELETE"] {
                    let shape = format!("$JS.API.STREAM.{call}.KV_tidings_delivered");
                    let owner =
                        service == Service::Dispatcher && (prefix != "*" || call != "DELETE");
                    assert_eq!(p(&shape), owner, "{service:?} {call}");
                }
            }
        }
    }

    #[test]
    fn only_the_api_and_the_redriving_dispatcher_handle_dead_letters_and_the_api_calls_the_roll() {
        let get = "$JS.API.STREAM.MSG.GET.tidings_dlq";
        let delete = "$JS.API.STREAM.MSG.DELETE.tidings_dlq";
        let roll_call = format!("tidings.{}", crate::roll_call::SUBJECT);
        let redrive = format!("tidings.{}", crate::redrive::SUBJECT);
        for service in Service::ALL {
            let api = service == Service::Api;
            let handles = matches!(service, Service::Api | Service::Dispatcher);
            assert_eq!(may_publish(service, "tidings", get), handles, "{service:?}");
            assert_eq!(
                may_publish(service, "tidings", delete),
                handles,
                "{service:?}"
            );
            assert_eq!(
                may_publish(service, "tidings", &redrive),
                api,
                "{service:?}"
            );
            let p = permissions(service, "tidings");
            assert_eq!(
                p.subscribe.iter().any(|s| matches(s, &redrive)),
                service == Service::Dispatcher,
                "{service:?}"
            );
            assert_eq!(
                may_publish(service, "tidings", &roll_call),
                api,
                "{service:?}"
            );
            // Nobody but the api reads another stream's messages by sequence.
            assert!(!may_publish(
                service,
                "tidings",
                "$JS.API.STREAM.MSG.GET.tidings_push"
            ));
            let answers = service == Service::Pusher;
            assert_eq!(p.subscribe.iter().any(|s| matches(s, &roll_call)), answers);
            assert_eq!(p.allow_responses, answers || handles && !api, "{service:?}");
        }
        // Only the dispatcher creates streams: the api, the detector and the internet-facing
        // pusher cannot make or reshape one.
        for service in Service::ALL {
            for stream in [
                "tidings_enqueue",
                "tidings_push",
                "tidings_result",
                "tidings_dlq",
            ] {
                assert_eq!(
                    may_publish(
                        service,
                        "tidings",
                        &format!("$JS.API.STREAM.CREATE.{stream}")
                    ),
                    service == Service::Dispatcher,
                    "{service:?} creating {stream}"
                );
            }
        }
        // The api consumes nothing.
        assert!(!may_publish(
            Service::Api,
            "tidings",
            "$JS.API.CONSUMER.CREATE.tidings_dlq.x"
        ));
    }

    #[test]
    fn replies_arrive_on_each_services_own_inbox() {
        for service in Service::ALL {
            let binary = format!("tidings-{}", service.name());
            let inbox = format!("{}.abc", inbox_prefix(&binary).unwrap());
            for other in Service::ALL {
                let sub = permissions(other, "tidings").subscribe;
                assert_eq!(
                    sub.iter().any(|p| matches(p, &inbox)),
                    other == service,
                    "{other:?} reading {service:?}'s replies"
                );
            }
        }
        assert_eq!(inbox_prefix("tidings-demo"), None);
    }

    #[test]
    fn the_server_config_names_every_user_and_its_permissions() {
        let config = server_config(
            "tidings",
            &[(Service::Pusher, "pusher", "\"pw\"")],
            Some(("admin", "$ADMIN")),
        );
        assert!(
            config.contains("user: \"pusher\", password: \"pw\""),
            "{config}"
        );
        assert!(config.contains("\"tidings.result.>\","), "{config}");
        assert!(!config.contains("\"tidings.enqueue.>\""), "{config}");
        assert!(
            config.contains("{ user: \"admin\", password: $ADMIN }"),
            "{config}"
        );
        assert!(config.contains("\nno_auth_user: \"admin\""), "{config}");
    }

    #[test]
    fn the_checked_in_configurations_are_the_generated_ones() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for (path, prefix, admin) in CHECKED_IN {
            tidings_testkit::harness::assert_generated(
                &root.join(path),
                &checked_in_config(prefix, admin),
                "tidings_bus::permissions",
            );
        }
    }
}
