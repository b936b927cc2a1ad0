//! The settings of the services that mail (docs/email.md): where the operator's relay is
//! ([`RelayArgs`], the pusher and the api), and who mails ([`SenderArgs`], the dispatcher and the
//! api: the From, the DKIM key, the public address the links start with). Email is off until
//! `TIDINGS_EMAIL_FROM` (and the relay's host, where one is read) is set.

use chrono::{DateTime, Utc};
use lettre::message::Mailbox;
use std::path::PathBuf;
use std::time::Duration;
use tidings_domain::duration::parse_duration;

use crate::dkim::{DkimError, DkimKey};
use crate::message::{Mail, MailError, MessageId, Unsubscribe, compose};
use crate::relay::{Relay, RelayError, RelaySettings, Security};
use tidings_domain::mail::MailText;

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("TIDINGS_SMTP_SECURITY: {0:?} is none of starttls, implicit, plain")]
    Security(String),
    #[error("TIDINGS_SMTP_USERNAME and TIDINGS_SMTP_PASSWORD go together")]
    Credentials,
    #[error(transparent)]
    Secret(#[from] tidings_runtime::secrets::SecretError),
    #[error("reading {path}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the relay")]
    Relay(#[from] RelayError),
    #[error("TIDINGS_EMAIL_FROM {0:?} is not an address (e.g. `Tidings <alerts@tidings.example>`)")]
    From(String),
    #[error("{0} must be set once TIDINGS_EMAIL_FROM is")]
    Missing(&'static str),
    #[error(
        "TIDINGS_PUBLIC_URL {0:?}: give the https:// (or http://) address the api is reached at"
    )]
    PublicUrl(String),
    #[error("the DKIM key in {path}")]
    Dkim {
        path: String,
        #[source]
        source: DkimError,
    },
}

/// The relay every mail is submitted to.
#[derive(clap::Args, Clone, Debug)]
pub struct RelayArgs {
    /// The SMTP relay's host name; email is off without it.
    #[arg(long = "smtp-host", env = "TIDINGS_SMTP_HOST")]
    pub smtp_host: Option<String>,
    /// Its port: by default 587 (starttls), 465 (implicit) or 25 (plain).
    #[arg(long = "smtp-port", env = "TIDINGS_SMTP_PORT")]
    pub smtp_port: Option<u16>,
    /// `starttls` (required, not opportunistic), `implicit` (TLS from the first byte) or `plain`
    /// (no TLS: a relay on the same host only).
    #[arg(
        long = "smtp-security",
        env = "TIDINGS_SMTP_SECURITY",
        default_value = "starttls"
    )]
    pub smtp_security: String,
    #[arg(long = "smtp-username", env = "TIDINGS_SMTP_USERNAME")]
    pub smtp_username: Option<String>,
    #[arg(
        long = "smtp-password",
        env = "TIDINGS_SMTP_PASSWORD",
        hide_env_values = true
    )]
    pub smtp_password: Option<String>,
    /// A file holding the password (a mounted Secret), instead of TIDINGS_SMTP_PASSWORD.
    #[arg(
        long = "smtp-password-file",
        env = "TIDINGS_SMTP_PASSWORD_FILE",
        conflicts_with = "smtp_password"
    )]
    pub smtp_password_file: Option<PathBuf>,
    /// The name Tidings greets the relay with (`EHLO`).
    #[arg(
        long = "smtp-hello",
        env = "TIDINGS_SMTP_HELLO",
        default_value = "localhost"
    )]
    pub smtp_hello: String,
    /// For each step of a submission: connecting (TLS and login included), and each command.
    #[arg(long = "smtp-timeout", env = "TIDINGS_SMTP_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub smtp_timeout: Duration,
    /// A PEM root certificate trusted for the relay instead of the system's.
    #[arg(long = "smtp-ca-file", env = "TIDINGS_SMTP_CA_FILE")]
    pub smtp_ca_file: Option<PathBuf>,
    /// Connections to the relay kept open between mails.
    #[arg(
        long = "smtp-idle-connections",
        env = "TIDINGS_SMTP_IDLE_CONNECTIONS",
        default_value_t = 8
    )]
    pub smtp_idle_connections: usize,
}

fn read(path: &PathBuf) -> Result<Vec<u8>, SettingsError> {
    std::fs::read(path).map_err(|source| SettingsError::File {
        path: path.display().to_string(),
        source,
    })
}

impl RelayArgs {
    /// The relay's settings, or `None` when no host is set.
    pub fn settings(&self) -> Result<Option<RelaySettings>, SettingsError> {
        let Some(host) = &self.smtp_host else {
            return Ok(None);
        };
        let (security, port) = match self.smtp_security.as_str() {
            "starttls" => (Security::StartTls, 587),
            "implicit" => (Security::Implicit, 465),
            "plain" => (Security::Plain, 25),
            other => return Err(SettingsError::Security(other.to_owned())),
        };
        let password = tidings_runtime::secrets::value_or_file(
            "TIDINGS_SMTP_PASSWORD",
            self.smtp_password.as_deref(),
            self.smtp_password_file.as_deref(),
        )?;
        let credentials = match (&self.smtp_username, password) {
            (Some(user), Some(password)) => Some((user.clone(), password)),
            (None, None) => None,
            _ => return Err(SettingsError::Credentials),
        };
        Ok(Some(RelaySettings {
            host: host.clone(),
            port: self.smtp_port.unwrap_or(port),
            security,
            credentials,
            hello: self.smtp_hello.clone(),
            timeout: self.smtp_timeout,
            roots_pem: self.smtp_ca_file.as_ref().map(read).transpose()?,
            idle: self.smtp_idle_connections,
        }))
    }

    /// The relay, or `None` when no host is set.
    pub fn relay(&self) -> Result<Option<Relay>, SettingsError> {
        Ok(self.settings()?.map(Relay::new).transpose()?)
    }
}

/// Who mails, and how readers reach back.
#[derive(clap::Args, Clone, Debug)]
pub struct SenderArgs {
    /// The From of every mail, e.g. `Tidings <alerts@tidings.example>`. Its domain signs
    /// (DKIM) and names each Message-ID. Email is off without it.
    #[arg(long = "email-from", env = "TIDINGS_EMAIL_FROM")]
    pub email_from: Option<String>,
    /// The envelope sender, where relays send bounces; by default the From's address.
    #[arg(long = "email-bounce-address", env = "TIDINGS_EMAIL_BOUNCE_ADDRESS")]
    pub email_bounce_address: Option<String>,
    /// The DKIM signing key: a PKCS#8 PEM, RSA (2048 bits or more) or Ed25519.
    #[arg(long = "dkim-key-file", env = "TIDINGS_DKIM_KEY_FILE")]
    pub dkim_key_file: Option<PathBuf>,
    /// The selector the key is published under (`<selector>._domainkey.<domain>`).
    #[arg(
        long = "dkim-selector",
        env = "TIDINGS_DKIM_SELECTOR",
        default_value = "tidings"
    )]
    pub dkim_selector: String,
    /// Where readers reach the api (`https://tidings.example`): every link in a mail starts
    /// with it.
    #[arg(long = "public-url", env = "TIDINGS_PUBLIC_URL")]
    pub public_url: Option<String>,
}

/// Who mails, ready to write mails.
pub struct Sender {
    /// The From, as given.
    pub from: String,
    /// The envelope sender.
    pub envelope: String,
    /// The From's domain.
    pub domain: String,
    pub dkim: DkimKey,
    /// Without a trailing `/`.
    pub public_url: String,
}

impl std::fmt::Debug for Sender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("from", &self.from)
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

impl SenderArgs {
    /// The sender, or `None` when no From is set.
    pub fn sender(&self) -> Result<Option<Sender>, SettingsError> {
        let Some(from) = &self.email_from else {
            return Ok(None);
        };
        let mailbox: Mailbox = (from.parse()).map_err(|_| SettingsError::From(from.clone()))?;
        let domain = mailbox.email.domain().to_owned();
        let path =
            (self.dkim_key_file.as_ref()).ok_or(SettingsError::Missing("TIDINGS_DKIM_KEY_FILE"))?;
        let dkim =
            DkimKey::from_pem(&read(path)?, &domain, &self.dkim_selector).map_err(|source| {
                SettingsError::Dkim {
                    path: path.display().to_string(),
                    source,
                }
            })?;
        let public =
            (self.public_url.as_deref()).ok_or(SettingsError::Missing("TIDINGS_PUBLIC_URL"))?;
        let public_url = public.trim_end_matches('/').to_owned();
        let plausible = (public_url.starts_with("https://") || public_url.starts_with("http://"))
            && !public_url.contains(['?', '#', ' ', '<', '>', '"']);
        if !plausible {
            return Err(SettingsError::PublicUrl(public.to_owned()));
        }
        Ok(Some(Sender {
            envelope: (self.email_bounce_address.clone())
                .unwrap_or_else(|| mailbox.email.to_string()),
            from: from.clone(),
            domain,
            dkim,
            public_url,
        }))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error(transparent)]
    Mail(#[from] MailError),
    #[error("DKIM")]
    Dkim(#[from] DkimError),
}

/// What one mail says, to whom: the rest is the sender's.
#[derive(Clone, Copy, Debug)]
pub struct Letter<'a> {
    pub to: &'a str,
    pub text: &'a MailText,
    /// Its `Message-ID`'s id (the sender's domain follows the `@`).
    pub id: &'a str,
    /// The one-click unsubscribe link.
    pub unsubscribe: &'a str,
}

impl Sender {
    /// `letter` from this sender, composed and DKIM-signed at `now`.
    pub fn write(&self, letter: Letter<'_>, now: DateTime<Utc>) -> Result<Vec<u8>, WriteError> {
        let message = compose(&Mail {
            from: &self.from,
            to: letter.to,
            subject: &letter.text.subject,
            text: &letter.text.text,
            html: &letter.text.html,
            message_id: MessageId {
                id: letter.id,
                domain: &self.domain,
            },
            unsubscribe: Unsubscribe {
                https: letter.unsubscribe,
                mailto: self.unsubscribe_mailbox(),
            },
            date: now,
        })?;
        Ok(self.dkim.sign(&message, now)?)
    }

    /// The address a reader's mail client sends an unsubscribe to (`List-Unsubscribe`'s mailto):
    /// the envelope sender, which receives bounces too.
    pub fn unsubscribe_mailbox(&self) -> &str {
        &self.envelope
    }
}
