//! Submission to the operator's relay over SMTP (lettre's connection, driven a command at a
//! time so that a refusal is known by where it came: at `RCPT` it is about the mailbox, anywhere
//! else about the mail or the relay). Connections are kept for the next mail.

use lettre::Address;
use lettre::transport::smtp::authentication::{Credentials, Mechanism};
#[allow(deprecated)]
use lettre::transport::smtp::client::AsyncNetworkStream;
use lettre::transport::smtp::client::{
    AsyncSmtpConnection, Certificate, CertificateStore, TlsParameters,
};
use lettre::transport::smtp::commands::{Data, Mail, Rcpt};
use lettre::transport::smtp::extension::ClientId;
use lettre::transport::smtp::response::{Response, Severity};
use std::sync::Mutex;
use std::time::Duration;
use tidings_domain::messages::Ended;
use tidings_domain::outbox::FailReason;
use tokio_util::compat::FuturesAsyncReadCompatExt;

use crate::metered::{Meter, Metered, Secured};

/// The longest reply kept for an attempt's record or as a queue id.
pub const MAX_REPLY: usize = 512;

/// How the connection to the relay is secured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Security {
    /// TLS from the first byte (port 465).
    Implicit,
    /// Plain, then `STARTTLS`, required (port 587).
    StartTls,
    /// No TLS at all: a relay on the same host, or tests.
    Plain,
}

#[derive(Clone, Debug)]
pub struct RelaySettings {
    pub host: String,
    pub port: u16,
    pub security: Security,
    /// `AUTH` (PLAIN or LOGIN) with these, after TLS.
    pub credentials: Option<(String, String)>,
    /// The name Tidings greets with (`EHLO`).
    pub hello: String,
    /// For each step: connecting (greeting, TLS and login included), and each command's answer.
    pub timeout: Duration,
    /// Trusted instead of the system's roots (a relay with its own CA, or tests).
    pub roots_pem: Option<Vec<u8>>,
    /// Connections kept open between mails.
    pub idle: usize,
}

/// How one submission ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Submitted {
    /// `250` after the data: the relay has it. Its reply names it in its queue.
    Accepted { reply: String },
    /// A `4xx`, or the relay could not be reached or talked to before the data went: try again.
    Deferred { code: Option<u16>, reply: String },
    /// A `5xx` to `RCPT`: the mailbox is refused.
    MailboxRefused { code: u16, reply: String },
    /// Any other `5xx`: this mail will not be taken.
    Refused { code: u16, reply: String },
    /// The data was sent but no answer came: the relay may have the mail.
    Unknown { reply: String },
}

impl Submitted {
    /// What the submission means for its outbox row: accepted is delivered, with the relay's
    /// queue id as the message id; a deferral is tried again; a refused mailbox is gone (its
    /// subscription is deactivated, `mailbox_rejected`); another refusal fails the row
    /// (`mail_rejected`); no answer after the data is tried again, marked maybe delivered.
    pub fn ended(&self) -> Ended {
        match self {
            Submitted::Accepted { reply } => Ended::Delivered {
                message_id: Some(queue_id(reply).to_owned()),
            },
            Submitted::Deferred { .. } => Ended::Transient {
                retry_after: None,
                maybe_delivered: false,
            },
            Submitted::MailboxRefused { .. } => Ended::Gone {
                maybe_delivered: false,
            },
            Submitted::Refused { .. } => Ended::Permanent {
                refused: Some(FailReason::MailRejected),
                maybe_delivered: false,
            },
            Submitted::Unknown { .. } => Ended::Transient {
                retry_after: None,
                maybe_delivered: true,
            },
        }
    }

    /// The relay's words, for the attempt's record, when it did not accept.
    pub fn error(&self) -> Option<String> {
        let code = |c: &Option<u16>| c.map_or("no answer".to_owned(), |c| format!("SMTP {c}"));
        match self {
            Submitted::Accepted { .. } => None,
            Submitted::Deferred { code: c, reply } => Some(format!("{}: {reply}", code(c))),
            Submitted::MailboxRefused { code, reply } => {
                Some(format!("SMTP {code} to RCPT: {reply}"))
            }
            Submitted::Refused { code, reply } => Some(format!("SMTP {code}: {reply}")),
            Submitted::Unknown { reply } => Some(format!(
                "no answer after the data (the relay may have the mail): {reply}"
            )),
        }
    }
}

/// The relay's queue id in its `250` reply (`2.0.0 Ok: queued as 4BQ2…`), else the reply.
pub fn queue_id(reply: &str) -> &str {
    let reply = reply.trim();
    match reply.to_ascii_lowercase().find("queued as ") {
        Some(at) => (reply[at + "queued as ".len()..].split_whitespace().next()).unwrap_or(reply),
        None => reply,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{which} {value:?} is not an address")]
    Address {
        which: &'static str,
        value: String,
        #[source]
        source: lettre::address::AddressError,
    },
    #[error("the relay's TLS settings")]
    Tls(#[source] lettre::transport::smtp::Error),
}

pub struct Relay {
    settings: RelaySettings,
    tls: Option<TlsParameters>,
    hello: ClientId,
    idle: Mutex<Vec<(AsyncSmtpConnection, Meter)>>,
}

/// Which command a reply answered.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Connect,
    Mail,
    Rcpt,
    Data,
    Content,
}

impl Relay {
    pub fn new(settings: RelaySettings) -> Result<Self, RelayError> {
        let tls = match settings.security {
            Security::Plain => None,
            Security::Implicit | Security::StartTls => {
                let mut builder = TlsParameters::builder(settings.host.clone());
                if let Some(pem) = &settings.roots_pem {
                    let root = Certificate::from_pem(pem).map_err(RelayError::Tls)?;
                    builder = builder
                        .certificate_store(CertificateStore::None)
                        .add_root_certificate(root);
                }
                Some(builder.build_rustls().map_err(RelayError::Tls)?)
            }
        };
        Ok(Relay {
            hello: ClientId::Domain(settings.hello.clone()),
            tls,
            settings,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// Submits `message` from `from` to `to`, on a kept connection or a new one.
    pub async fn submit(
        &self,
        from: &str,
        to: &str,
        message: &[u8],
    ) -> Result<Submitted, RelayError> {
        let from = address("from", from)?;
        let to = address("to", to)?;
        let kept = (self.idle.lock())
            .map(|mut idle| idle.pop())
            .unwrap_or_default();
        let alive = match kept {
            Some((mut conn, meter)) => {
                meter.renew();
                let timeout = self.settings.timeout;
                let alive = tokio::time::timeout(timeout, conn.test_connected()).await;
                alive.unwrap_or(false).then_some((conn, meter))
            }
            None => None,
        };
        let (mut conn, meter) = match alive {
            Some(conn) => conn,
            None => match self.connected().await {
                Ok(conn) => conn,
                Err(Unreached::Failed(e)) => return Ok(ended(Step::Connect, &e)),
                Err(Unreached::NoStartTls) => {
                    return Ok(Submitted::Deferred {
                        code: None,
                        reply: "the relay does not offer STARTTLS, which is required".into(),
                    });
                }
            },
        };
        let submitted = transaction(&mut conn, self.settings.timeout, from, to, message).await;
        // Only a connection whose transaction ended cleanly is ready for the next mail.
        if matches!(submitted, Submitted::Accepted { .. })
            && !conn.has_broken()
            && let Ok(mut idle) = self.idle.lock()
            && idle.len() < self.settings.idle
        {
            idle.push((conn, meter));
        } else {
            // `QUIT` and close, without waiting longer on a relay that stopped answering.
            let _ = tokio::time::timeout(self.settings.timeout, conn.abort()).await;
        }
        Ok(submitted)
    }

    /// Whether a new connection is greeted, secured and logged in (`doctor`): `None` if so, or
    /// why not. The connection is closed with `QUIT`.
    pub async fn unreachable(&self) -> Option<String> {
        match self.connected().await {
            Ok((mut conn, _)) => {
                let _ = tokio::time::timeout(self.settings.timeout, conn.quit()).await;
                None
            }
            Err(Unreached::NoStartTls) => {
                Some("it does not offer STARTTLS, which is required".into())
            }
            Err(Unreached::Failed(Failed::Silent(after))) => {
                Some(format!("no answer within {} ms", after.as_millis()))
            }
            Err(Unreached::Failed(Failed::Smtp(e))) => Some(bounded(e.to_string())),
            Err(Unreached::Failed(Failed::Connect(e))) => Some(bounded(e.to_string())),
        }
    }

    /// Where it is, as `host:port`.
    pub fn address(&self) -> String {
        format!("{}:{}", self.settings.host, self.settings.port)
    }

    /// A new connection, greeted, secured and logged in, within the timeout; with the meter of
    /// what the relay sent on it.
    async fn connected(&self) -> Result<(AsyncSmtpConnection, Meter), Unreached> {
        let timeout = self.settings.timeout;
        match tokio::time::timeout(timeout, self.connect()).await {
            Ok(conn) => conn,
            Err(_) => Err(Unreached::Failed(Failed::Silent(timeout))),
        }
    }

    async fn connect(&self) -> Result<(AsyncSmtpConnection, Meter), Unreached> {
        let s = &self.settings;
        let implicit = (s.security == Security::Implicit)
            .then(|| self.tls.clone())
            .flatten();
        let tcp = tokio::net::TcpStream::connect((s.host.as_str(), s.port))
            .await
            .map_err(|e| Unreached::Failed(Failed::Connect(e)))?;
        let (metered, meter) = Metered::new(tcp);
        let mut conn = match implicit {
            Some(tls) => {
                #[allow(deprecated)]
                let mut stream = AsyncNetworkStream::use_existing_tokio1(Box::new(metered));
                stream.upgrade_tls(tls).await?;
                let secured = Box::new(Secured(stream.compat()));
                AsyncSmtpConnection::connect_with_transport(secured, &self.hello).await?
            }
            None => {
                AsyncSmtpConnection::connect_with_transport(Box::new(metered), &self.hello).await?
            }
        };
        if s.security == Security::StartTls
            && let Some(tls) = self.tls.clone()
        {
            // Required: a relay that does not offer it is not talked to in the clear.
            if !conn.can_starttls() {
                // Under the caller's timeout, as all of the connecting is.
                conn.abort().await;
                return Err(Unreached::NoStartTls);
            }
            conn.starttls(tls, &self.hello).await?;
        }
        if let Some((user, password)) = &s.credentials {
            let credentials = Credentials::new(user.clone(), password.clone());
            conn.auth(&[Mechanism::Plain, Mechanism::Login], &credentials)
                .await?;
        }
        Ok((conn, meter))
    }
}

/// Why no connection was made.
enum Unreached {
    Failed(Failed),
    NoStartTls,
}

impl From<lettre::transport::smtp::Error> for Unreached {
    fn from(e: lettre::transport::smtp::Error) -> Self {
        Unreached::Failed(Failed::Smtp(e))
    }
}

/// Why a step got no positive answer.
enum Failed {
    Smtp(lettre::transport::smtp::Error),
    /// No TCP connection to the relay.
    Connect(std::io::Error),
    /// No answer within the timeout.
    Silent(Duration),
}

/// `step`'s answer, within `timeout`.
async fn within(
    timeout: Duration,
    step: impl Future<Output = Result<Response, lettre::transport::smtp::Error>>,
) -> Result<Response, Failed> {
    match tokio::time::timeout(timeout, step).await {
        Ok(answer) => answer.map_err(Failed::Smtp),
        Err(_) => Err(Failed::Silent(timeout)),
    }
}

/// One mail's `MAIL`, `RCPT`, `DATA` and content, each answer read before the next.
async fn transaction(
    conn: &mut AsyncSmtpConnection,
    timeout: Duration,
    from: Address,
    to: Address,
    message: &[u8],
) -> Submitted {
    let mail = conn.command(Mail::new(Some(from), vec![]));
    if let Err(e) = within(timeout, mail).await {
        return ended(Step::Mail, &e);
    }
    if let Err(e) = within(timeout, conn.command(Rcpt::new(to, vec![]))).await {
        return ended(Step::Rcpt, &e);
    }
    if let Err(e) = within(timeout, conn.command(Data)).await {
        return ended(Step::Data, &e);
    }
    match within(timeout, conn.message(message)).await {
        Ok(answer) => Submitted::Accepted {
            reply: bounded(answer.message().collect::<Vec<_>>().join(" ")),
        },
        Err(e) => ended(Step::Content, &e),
    }
}

/// What a failed `step` means: by the reply's code where there was one; without one, a step
/// before the content was not taken (try again), and the content may have been.
fn ended(step: Step, failed: &Failed) -> Submitted {
    let (status, reply) = match failed {
        Failed::Smtp(e) => (e.status(), bounded(e.to_string())),
        Failed::Connect(e) => (None, bounded(format!("connecting: {e}"))),
        Failed::Silent(after) => (None, format!("no answer within {} ms", after.as_millis())),
    };
    match status {
        Some(code) if code.severity == Severity::TransientNegativeCompletion => {
            Submitted::Deferred {
                code: Some(u16::from(code)),
                reply,
            }
        }
        Some(code) if code.severity == Severity::PermanentNegativeCompletion => {
            let code = u16::from(code);
            if step == Step::Rcpt {
                Submitted::MailboxRefused { code, reply }
            } else {
                Submitted::Refused { code, reply }
            }
        }
        _ if step == Step::Content => Submitted::Unknown { reply },
        other => Submitted::Deferred {
            code: other.map(u16::from),
            reply,
        },
    }
}

fn address(which: &'static str, value: &str) -> Result<Address, RelayError> {
    value.parse().map_err(|source| RelayError::Address {
        which,
        value: value.to_owned(),
        source,
    })
}

/// `text` cut to [`MAX_REPLY`] bytes, at a character boundary.
fn bounded(mut text: String) -> String {
    if text.len() > MAX_REPLY {
        let mut at = MAX_REPLY;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_id_is_what_the_relay_named() {
        assert_eq!(queue_id("2.0.0 Ok: queued as 4BQ2XY1z "), "4BQ2XY1z");
        assert_eq!(queue_id("OK QUEUED AS abc (more)"), "abc");
        assert_eq!(queue_id(" Message accepted "), "Message accepted");
        assert_eq!(queue_id("queued as "), "queued as");
    }

    #[test]
    fn each_answer_ends_its_row_as_docs_email_says() {
        let r = |s: &str| s.to_owned();
        let accepted = Submitted::Accepted {
            reply: r("Ok: queued as Q1"),
        };
        assert_eq!(
            accepted.ended(),
            Ended::Delivered {
                message_id: Some(r("Q1"))
            }
        );
        assert_eq!(accepted.error(), None);
        let deferred = Submitted::Deferred {
            code: Some(451),
            reply: r("try later"),
        };
        assert!(matches!(
            deferred.ended(),
            Ended::Transient {
                maybe_delivered: false,
                ..
            }
        ));
        assert_eq!(deferred.error().unwrap(), "SMTP 451: try later");
        let unreachable = Submitted::Deferred {
            code: None,
            reply: r("connection refused"),
        };
        assert_eq!(
            unreachable.error().unwrap(),
            "no answer: connection refused"
        );
        let mailbox = Submitted::MailboxRefused {
            code: 550,
            reply: r("no such user"),
        };
        assert_eq!(
            mailbox.ended(),
            Ended::Gone {
                maybe_delivered: false
            }
        );
        assert_eq!(mailbox.error().unwrap(), "SMTP 550 to RCPT: no such user");
        let refused = Submitted::Refused {
            code: 554,
            reply: r("spam"),
        };
        assert_eq!(
            refused.ended(),
            Ended::Permanent {
                refused: Some(FailReason::MailRejected),
                maybe_delivered: false
            }
        );
        let unknown = Submitted::Unknown {
            reply: r("timed out"),
        };
        assert!(matches!(
            unknown.ended(),
            Ended::Transient {
                maybe_delivered: true,
                ..
            }
        ));
    }
}
