//! Webhook signing secrets sealed for storage: a dump or backup of the database then holds no
//! secret that could sign a webhook a receiver would trust. AES-256-GCM under keys the operator
//! gives both the api (which seals) and the dispatcher (which opens to sign): the first key seals,
//! every key opens, so keys rotate by putting a new one first, sealing every stored secret again
//! (`tidings-api reseal`), and dropping the old one.
//!
//! Stored as `sealed2.<key id>.<base64 of nonce and ciphertext>`; the key id is the first four
//! bytes of the key's SHA-256, in hex. The seal is bound to its subscription (its id is in the
//! associated data), so a sealed secret copied to another endpoint's row does not open there:
//! whoever can write the table cannot make one receiver's secret sign for another. `sealed1.`
//! (bound to nothing, from before) still opens until `tidings-api reseal` rewrites it. A stored
//! `whsec_…` (written before keys were given) is opened as it is.

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use aws_lc_rs::digest::{SHA256, digest};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use uuid::Uuid;

const PREFIX: &str = "sealed2.";
/// What `sealed1.` values were: bound to their use only.
const UNBOUND: &str = "sealed1.";
/// Binds a sealed value to its use: a value sealed for something else does not open as one.
const AAD: &[u8] = b"tidings webhook signing secret";

/// The associated data of a seal for `subscription`: the use, then the subscription's id.
fn bound(subscription: Uuid) -> Vec<u8> {
    let mut aad = AAD.to_vec();
    aad.push(0);
    aad.extend_from_slice(subscription.as_bytes());
    aad
}

/// The keys that seal and open secrets; the first seals.
pub struct SecretKeys {
    keys: Vec<(String, LessSafeKey)>,
}

/// Names no key.
impl std::fmt::Debug for SecretKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretKeys({:?})", self.ids())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadKeys {
    #[error("no key: give one or more, one a line, each the base64 of 32 random bytes")]
    Empty,
    #[error("key {line} is not the base64 of 32 bytes")]
    Malformed { line: usize },
}

/// Why a stored secret could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unopened {
    #[error("sealed under key {0}, which is not among the keys given")]
    UnknownKey(String),
    #[error("sealed, but no keys are given (TIDINGS_WEBHOOK_SECRET_KEYS)")]
    NoKeys,
    #[error("not a sealed secret, altered since it was sealed, or sealed for another subscription")]
    Corrupt,
    #[error(
        "stored unsealed although sealing keys are given; seal it: tidings-api reseal (with the keys)"
    )]
    Unsealed,
}

impl SecretKeys {
    /// Keys written one a line (blank lines and `#` comments skipped), each the base64 of 32
    /// bytes; the first seals.
    pub fn parse(text: &str) -> Result<Self, BadKeys> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let malformed = BadKeys::Malformed { line: i + 1 };
            let bytes = STANDARD.decode(line).map_err(|_| malformed.clone())?;
            let key = (bytes.len() == 32)
                .then(|| UnboundKey::new(&AES_256_GCM, &bytes).ok())
                .flatten()
                .ok_or(malformed)?;
            keys.push((key_id(&bytes), LessSafeKey::new(key)));
        }
        if keys.is_empty() {
            return Err(BadKeys::Empty);
        }
        Ok(SecretKeys { keys })
    }

    /// `secret` of `subscription` sealed under the first key, with a fresh random nonce.
    pub fn seal(
        &self,
        secret: &str,
        subscription: Uuid,
    ) -> Result<String, aws_lc_rs::error::Unspecified> {
        let (id, key) = &self.keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce)?;
        let mut sealed = secret.as_bytes().to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(bound(subscription)),
            &mut sealed,
        )?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(format!("{PREFIX}{id}.{}", STANDARD.encode(out)))
    }

    /// Each key's id, the first (the one that seals) first.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|(id, _)| id.as_str()).collect()
    }

    /// Whether `stored` is sealed under the first key (what [`SecretKeys::seal`] makes now).
    pub fn sealed_by_first(&self, stored: &str) -> bool {
        stored
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split_once('.'))
            .is_some_and(|(id, _)| id == self.keys[0].0)
    }

    fn open_sealed(&self, id: &str, data: &str, aad: &[u8]) -> Result<String, Unopened> {
        let (_, key) = (self.keys.iter())
            .find(|(k, _)| k == id)
            .ok_or_else(|| Unopened::UnknownKey(id.to_owned()))?;
        let bytes = STANDARD.decode(data).map_err(|_| Unopened::Corrupt)?;
        if bytes.len() < NONCE_LEN {
            return Err(Unopened::Corrupt);
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Unopened::Corrupt)?;
        let mut sealed = sealed.to_vec();
        let plain = key
            .open_in_place(nonce, Aad::from(aad), &mut sealed)
            .map_err(|_| Unopened::Corrupt)?;
        String::from_utf8(plain.to_vec()).map_err(|_| Unopened::Corrupt)
    }
}

/// The secret `stored` (of `subscription`) holds: opened with `keys` if it is sealed; as it is
/// if it is not and no keys are given. Once keys are given a secret stored as it is does not
/// open ([`Unopened::Unsealed`], naming the fix): whoever can write the table could otherwise
/// put a secret of their own in place of a sealed one.
pub fn open(
    stored: &str,
    keys: Option<&SecretKeys>,
    subscription: Uuid,
) -> Result<String, Unopened> {
    if keys.is_some() && !is_sealed(stored) {
        return Err(Unopened::Unsealed);
    }
    open_for_reseal(stored, keys, subscription)
}

fn is_sealed(stored: &str) -> bool {
    stored.starts_with(PREFIX) || stored.starts_with(UNBOUND)
}

/// As [`open`], but a secret stored as it is opens whatever the keys: what `reseal` reads to
/// seal it.
pub fn open_for_reseal(
    stored: &str,
    keys: Option<&SecretKeys>,
    subscription: Uuid,
) -> Result<String, Unopened> {
    let (rest, aad) = match (stored.strip_prefix(PREFIX), stored.strip_prefix(UNBOUND)) {
        (Some(rest), _) => (rest, bound(subscription)),
        (None, Some(rest)) => (rest, AAD.to_vec()),
        (None, None) => return Ok(stored.to_owned()),
    };
    let (id, data) = rest.split_once('.').ok_or(Unopened::Corrupt)?;
    keys.ok_or(Unopened::NoKeys)?.open_sealed(id, data, &aad)
}

/// `secret` of `subscription` as it is stored: sealed when keys are given.
pub fn store(
    secret: &str,
    keys: Option<&SecretKeys>,
    subscription: Uuid,
) -> Result<String, aws_lc_rs::error::Unspecified> {
    match keys {
        Some(keys) => keys.seal(secret, subscription),
        None => Ok(secret.to_owned()),
    }
}

/// The keys, given to the api and the dispatcher alike.
#[derive(clap::Args, Clone, Debug)]
pub struct SecretKeyArgs {
    /// Keys that seal webhook signing secrets in the database, one a line (or comma-separated),
    /// each the base64 of 32 random bytes (`openssl rand -base64 32`); the first seals, every
    /// one opens. Without keys secrets are stored as they are.
    #[arg(
        long = "webhook-secret-keys",
        env = "TIDINGS_WEBHOOK_SECRET_KEYS",
        hide_env_values = true
    )]
    pub webhook_secret_keys: Option<String>,
    /// A file holding the keys (a mounted Secret), instead of TIDINGS_WEBHOOK_SECRET_KEYS.
    #[arg(
        long = "webhook-secret-keys-file",
        env = "TIDINGS_WEBHOOK_SECRET_KEYS_FILE",
        conflicts_with = "webhook_secret_keys"
    )]
    pub webhook_secret_keys_file: Option<std::path::PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    #[error(transparent)]
    File(#[from] tidings_runtime::secrets::SecretError),
    #[error("TIDINGS_WEBHOOK_SECRET_KEYS: {0}")]
    Bad(#[from] BadKeys),
}

impl SecretKeyArgs {
    /// The keys, if any are given.
    pub fn keys(&self) -> Result<Option<std::sync::Arc<SecretKeys>>, KeysError> {
        // Commas separate keys only in the variable; a file may have them in its comments.
        let listed = self
            .webhook_secret_keys
            .as_ref()
            .map(|t| t.replace(',', "\n"));
        let text = tidings_runtime::secrets::value_or_file(
            "TIDINGS_WEBHOOK_SECRET_KEYS",
            listed.as_deref(),
            self.webhook_secret_keys_file.as_deref(),
        )?;
        let Some(text) = text else {
            return Ok(None);
        };
        Ok(Some(std::sync::Arc::new(SecretKeys::parse(&text)?)))
    }
}

fn key_id(key: &[u8]) -> String {
    digest(&SHA256, key).as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const B: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SUB: Uuid = Uuid::from_u128(0x0193_0000_0000_7000_8000_0000_0000_0001);

    #[test]
    fn a_sealed_secret_opens_to_itself_and_shows_nothing_of_it() {
        let keys = SecretKeys::parse(A).unwrap();
        let sealed = store(SECRET, Some(&keys), SUB).unwrap();
        assert!(sealed.starts_with("sealed2."), "{sealed}");
        assert!(!sealed.contains("MfKQ9r8"), "{sealed}");
        assert_ne!(
            sealed,
            keys.seal(SECRET, SUB).unwrap(),
            "a fresh nonce each time"
        );
        assert_eq!(open(&sealed, Some(&keys), SUB).unwrap(), SECRET);
    }

    #[test]
    fn keys_rotate_the_first_seals_every_one_opens() {
        let old = SecretKeys::parse(A).unwrap();
        let sealed_before = old.seal(SECRET, SUB).unwrap();
        let both = SecretKeys::parse(&format!("# new first\n{B}\n\n{A}\n")).unwrap();
        let sealed_after = both.seal(SECRET, SUB).unwrap();
        assert_eq!(open(&sealed_before, Some(&both), SUB).unwrap(), SECRET);
        assert_eq!(open(&sealed_after, Some(&both), SUB).unwrap(), SECRET);
        // Once the old key is dropped, what it alone sealed does not open, and says which key.
        let new = SecretKeys::parse(B).unwrap();
        let id = sealed_before.split('.').nth(1).unwrap().to_owned();
        assert_eq!(
            open(&sealed_before, Some(&new), SUB),
            Err(Unopened::UnknownKey(id))
        );
    }

    #[test]
    fn an_altered_or_unkeyed_sealed_secret_does_not_open() {
        let keys = SecretKeys::parse(A).unwrap();
        let sealed = keys.seal(SECRET, SUB).unwrap();
        let mut altered = sealed.clone().into_bytes();
        let last = altered.len() - 3;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert_eq!(open(&altered, Some(&keys), SUB), Err(Unopened::Corrupt));
        assert_eq!(open(&sealed, None, SUB), Err(Unopened::NoKeys));
        assert_eq!(
            open("sealed2.nodot", Some(&keys), SUB),
            Err(Unopened::Corrupt)
        );
    }

    /// Regression: a seal was bound to its use only, so someone who can write the table could
    /// copy one endpoint's sealed secret to another's row and it signed there.
    #[test]
    fn a_sealed_secret_opens_only_for_its_own_subscription() {
        let keys = SecretKeys::parse(A).unwrap();
        let sealed = keys.seal(SECRET, SUB).unwrap();
        let other = Uuid::from_u128(SUB.as_u128() + 1);
        assert_eq!(open(&sealed, Some(&keys), other), Err(Unopened::Corrupt));
        assert_eq!(open(&sealed, Some(&keys), SUB).unwrap(), SECRET);
    }

    /// What earlier releases stored still opens (for any subscription), until resealed.
    #[test]
    fn a_secret_sealed_before_seals_were_bound_still_opens() {
        let keys = SecretKeys::parse(A).unwrap();
        let (id, key) = &keys.keys[0];
        let nonce = [7u8; NONCE_LEN];
        let mut sealed = SECRET.as_bytes().to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(AAD),
            &mut sealed,
        )
        .unwrap();
        let stored = format!(
            "{UNBOUND}{id}.{}",
            STANDARD.encode([&nonce[..], &sealed].concat())
        );
        assert_eq!(open(&stored, Some(&keys), SUB).unwrap(), SECRET);
        assert!(!keys.sealed_by_first(&stored), "reseal rewrites it");
    }

    /// Regression: a plain secret still opened once keys were given (a downgrade: anyone who
    /// can write the table could put in a secret of their own).
    #[test]
    fn a_secret_stored_as_it_is_opens_only_while_no_keys_are_given() {
        let keys = SecretKeys::parse(A).unwrap();
        assert_eq!(open(SECRET, None, SUB).unwrap(), SECRET);
        assert_eq!(open(SECRET, Some(&keys), SUB), Err(Unopened::Unsealed));
        assert!(
            Unopened::Unsealed
                .to_string()
                .contains("tidings-api reseal")
        );
        assert_eq!(open_for_reseal(SECRET, Some(&keys), SUB).unwrap(), SECRET);
        assert_eq!(store(SECRET, None, SUB).unwrap(), SECRET);
    }

    #[test]
    fn keys_come_comma_separated_in_the_variable_or_a_line_each_in_a_file() {
        let given = |keys: Option<String>, file: Option<std::path::PathBuf>| SecretKeyArgs {
            webhook_secret_keys: keys,
            webhook_secret_keys_file: file,
        };
        let ids = |k: Option<std::sync::Arc<SecretKeys>>| {
            let k = k.unwrap();
            k.ids().iter().map(|id| id.to_string()).collect::<Vec<_>>()
        };
        let both = ids(given(Some(format!("{B},{A}")), None).keys().unwrap());
        assert_eq!(both.len(), 2);
        let path = std::env::temp_dir().join(format!("keys-{}", std::process::id()));
        std::fs::write(&path, format!("# new, then old\n{B}\n{A}\n")).unwrap();
        let from_file = given(None, Some(path.clone())).keys();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(ids(from_file.unwrap()), both);
        assert!(given(None, None).keys().unwrap().is_none());
        let missing = given(None, Some(path)).keys().unwrap_err();
        assert!(
            missing
                .to_string()
                .starts_with("TIDINGS_WEBHOOK_SECRET_KEYS_FILE "),
            "{missing}"
        );
    }

    #[test]
    fn keys_must_be_32_bytes_of_base64() {
        assert_eq!(SecretKeys::parse("\n# none\n").unwrap_err(), BadKeys::Empty);
        assert_eq!(
            SecretKeys::parse(&format!("{A}\nshort")).unwrap_err(),
            BadKeys::Malformed { line: 2 }
        );
        assert_eq!(
            SecretKeys::parse("AAEC").unwrap_err(),
            BadKeys::Malformed { line: 1 }
        );
    }
}
