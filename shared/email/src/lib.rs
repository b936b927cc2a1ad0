//! Email as Tidings sends it.
//!
//! - [`message`]: one notification as a mail: text and HTML from the same words as the push,
//!   headers no item name, template value or address can inject into (lettre encodes them per
//!   RFC 2047 and refuses an address with a line break), `Auto-Submitted`, a `Message-ID` named
//!   for its outbox row, and a one-click unsubscribe (RFC 8058).
//! - [`dkim`]: its DKIM signature (RFC 6376, `relaxed/relaxed`), RSA-SHA256 or Ed25519-SHA256
//!   (RFC 8463) on aws-lc-rs, the crypto the rest of Tidings uses; and the DNS record that
//!   publishes the key.
//! - [`relay`]: submission to the operator's relay over SMTP (STARTTLS or implicit TLS, AUTH),
//!   each refusal known by the command it answered; connections kept for the next mail, each
//!   reading at most [`metered::BUDGET`] bytes of the relay's per mail.
//! - [`links`]: the signed links a mail carries (the notification's page, the unsubscribe).
//! - [`settings`]: the relay's and the sender's settings, shared by the services that mail.

pub mod dkim;
pub mod links;
pub mod message;
pub mod metered;
pub mod relay;
pub mod settings;
