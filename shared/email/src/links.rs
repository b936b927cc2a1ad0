//! The links a mail carries, signed so that only its reader can follow them: the page that shows
//! whether a notification still holds (`/n/{outbox id}?t=…`) and the unsubscribe
//! (`/v1/email/unsubscribe?s={subscription id}&t=…`). Each token is an HMAC-SHA256, cut to 16
//! bytes, of what the link names, under the subscription's own key: a key the dispatcher writes
//! with and the api checks with, stored sealed like a webhook's secret. A token names one
//! purpose, so the page's token cannot unsubscribe.

use aws_lc_rs::hmac;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// Bytes of a token: 128 bits, beyond guessing, short enough for a link.
const TOKEN_BYTES: usize = 16;

/// What a token lets its holder do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// See one notification beside the current value.
    Notification,
    /// Stop the subscription's mail.
    Unsubscribe,
}

impl Purpose {
    fn tag(self) -> &'static [u8] {
        match self {
            Purpose::Notification => b"tidings-notification:",
            Purpose::Unsubscribe => b"tidings-unsubscribe:",
        }
    }
}

/// A subscription's link key.
#[derive(Clone)]
pub struct LinkKey {
    key: hmac::Key,
}

/// Names nothing of the key.
impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkKey(..)")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a link key: the base64url of 32 bytes")]
pub struct BadLinkKey;

impl LinkKey {
    /// A new key, and how it is written (stored sealed, never shown).
    pub fn generate() -> Result<(Self, String), aws_lc_rs::error::Unspecified> {
        let mut bytes = [0u8; 32];
        SystemRandom::new().fill(&mut bytes)?;
        let text = URL_SAFE_NO_PAD.encode(bytes);
        Ok((Self::from_bytes(&bytes), text))
    }

    pub fn parse(text: &str) -> Result<Self, BadLinkKey> {
        let bytes = URL_SAFE_NO_PAD
            .decode(text.trim())
            .map_err(|_| BadLinkKey)?;
        if bytes.len() != 32 {
            return Err(BadLinkKey);
        }
        Ok(Self::from_bytes(&bytes))
    }

    fn from_bytes(bytes: &[u8]) -> Self {
        LinkKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, bytes),
        }
    }

    fn tag(&self, purpose: Purpose, id: &str) -> hmac::Tag {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(purpose.tag());
        ctx.update(id.as_bytes());
        ctx.sign()
    }

    /// The token for `purpose` on `id` (an outbox row's or a subscription's id).
    pub fn token(&self, purpose: Purpose, id: &str) -> String {
        URL_SAFE_NO_PAD.encode(&self.tag(purpose, id).as_ref()[..TOKEN_BYTES])
    }

    /// Whether `token` is this key's for `purpose` on `id`, compared in constant time.
    pub fn verifies(&self, purpose: Purpose, id: &str, token: &str) -> bool {
        let Ok(given) = URL_SAFE_NO_PAD.decode(token) else {
            return false;
        };
        let tag = self.tag(purpose, id);
        given.len() == TOKEN_BYTES
            && aws_lc_rs::constant_time::verify_slices_are_equal(
                &tag.as_ref()[..TOKEN_BYTES],
                &given,
            )
            .is_ok()
    }
}

/// The api's routes the links open.
pub const NOTIFICATION_PAGE: &str = "/n/";
pub const UNSUBSCRIBE: &str = "/v1/email/unsubscribe";
pub const CONFIRM: &str = "/v1/email/confirm";

/// A notification mail's two links, under `public_url` (the api as readers reach it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MailLinks {
    pub check: String,
    pub unsubscribe: String,
}

impl MailLinks {
    pub fn new(public_url: &str, key: &LinkKey, row: &str, subscription: &str) -> Self {
        MailLinks {
            check: format!(
                "{public_url}{NOTIFICATION_PAGE}{row}?t={}",
                key.token(Purpose::Notification, row)
            ),
            unsubscribe: format!(
                "{public_url}{UNSUBSCRIBE}?s={subscription}&t={}",
                key.token(Purpose::Unsubscribe, subscription)
            ),
        }
    }

    pub fn as_links(&self) -> tidings_domain::mail::Links<'_> {
        tidings_domain::mail::Links {
            check: &self.check,
            unsubscribe: &self.unsubscribe,
        }
    }
}

/// The confirmation link for `token` (random, single-use: not a signature).
pub fn confirm_link(public_url: &str, token: &str) -> String {
    format!("{public_url}{CONFIRM}?t={token}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_only_its_purpose_and_id_under_its_key() {
        let (key, text) = LinkKey::generate().unwrap();
        let again = LinkKey::parse(&text).unwrap();
        let t = key.token(Purpose::Notification, "row-1");
        assert_eq!(t.len(), 22);
        assert!(again.verifies(Purpose::Notification, "row-1", &t));
        assert!(!again.verifies(Purpose::Unsubscribe, "row-1", &t));
        assert!(!again.verifies(Purpose::Notification, "row-2", &t));
        let (other, _) = LinkKey::generate().unwrap();
        assert!(!other.verifies(Purpose::Notification, "row-1", &t));
        // Cut short, lengthened, or not base64 at all.
        assert!(!again.verifies(Purpose::Notification, "row-1", &t[..20]));
        assert!(!again.verifies(Purpose::Notification, "row-1", &format!("{t}AA")));
        assert!(!again.verifies(Purpose::Notification, "row-1", "%%%"));
        assert!(!again.verifies(Purpose::Notification, "row-1", ""));
    }

    #[test]
    fn a_key_is_32_bytes_of_base64url() {
        assert!(LinkKey::parse("").is_err());
        assert!(LinkKey::parse(&URL_SAFE_NO_PAD.encode([7u8; 31])).is_err());
        assert!(LinkKey::parse(&URL_SAFE_NO_PAD.encode([7u8; 32])).is_ok());
    }
}
