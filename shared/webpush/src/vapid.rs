//! VAPID (RFC 8292): an ES256 JWT that tells a push service who is sending.
//!
//! `aud` is the origin of the subscription's endpoint (scheme, host, and port when it is not the
//! default), `exp` at most 24 h ahead (we use 12 h), `sub` a `mailto:` or `https:` contact. A JWT
//! is signed once per origin and reused until an hour before it expires: signing costs more than
//! encrypting a message, and every push to FCM shares one origin.

use aws_lc_rs::agreement::{ECDH_P256, PrivateKey};
use aws_lc_rs::encoding::AsBigEndian;
use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chrono::{DateTime, Duration, Utc};
use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

/// How long a signed JWT is valid.
pub const JWT_LIFETIME: Duration = Duration::hours(12);
/// A cached JWT is replaced when less than this is left.
pub const RENEW_BEFORE: Duration = Duration::hours(1);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VapidError {
    #[error("VAPID private key is neither a base64url P-256 scalar nor a PEM EC private key")]
    KeyFormat,
    #[error("VAPID private key is not a valid P-256 key")]
    KeyInvalid,
    #[error("VAPID subject must start with mailto: or https:, got {0:?}")]
    Subject(String),
    #[error("endpoint {0:?} has no origin to address a VAPID token to")]
    Audience(String),
    #[error("signing the VAPID token failed")]
    Sign,
}

/// The application server's key pair. Its `Debug` never prints the private key.
pub struct VapidKey {
    pair: EcdsaKeyPair,
    public_b64: String,
}

impl fmt::Debug for VapidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VapidKey")
            .field("public", &self.public_b64)
            .finish_non_exhaustive()
    }
}

impl VapidKey {
    /// Reads a private key given as a base64url 32-byte scalar (the form web-push tools print)
    /// or as PEM (SEC1 `EC PRIVATE KEY` or PKCS#8 `PRIVATE KEY`).
    pub fn parse(text: &str) -> Result<Self, VapidError> {
        let text = text.trim();
        if text.starts_with("-----BEGIN") {
            let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
            let der = STANDARD
                .decode(body.trim())
                .map_err(|_| VapidError::KeyFormat)?;
            let pair = EcdsaKeyPair::from_private_key_der(&ECDSA_P256_SHA256_FIXED_SIGNING, &der)
                .map_err(|_| VapidError::KeyInvalid)?;
            let public_b64 = URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
            return Ok(VapidKey { pair, public_b64 });
        }
        let scalar = URL_SAFE_NO_PAD
            .decode(text.trim_end_matches('='))
            .map_err(|_| VapidError::KeyFormat)?;
        Self::from_scalar(&scalar)
    }

    fn from_scalar(scalar: &[u8]) -> Result<Self, VapidError> {
        if scalar.len() != 32 {
            return Err(VapidError::KeyFormat);
        }
        // The public point, derived from the scalar by the same library.
        let public = PrivateKey::from_private_key(&ECDH_P256, scalar)
            .map_err(|_| VapidError::KeyInvalid)?
            .compute_public_key()
            .map_err(|_| VapidError::KeyInvalid)?;
        let pair = EcdsaKeyPair::from_private_key_and_public_key(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            scalar,
            public.as_ref(),
        )
        .map_err(|_| VapidError::KeyInvalid)?;
        Ok(VapidKey {
            pair,
            public_b64: URL_SAFE_NO_PAD.encode(public.as_ref()),
        })
    }

    /// A new key pair: (private scalar, public key), both base64url. The public key is what
    /// browsers pass to `pushManager.subscribe` as `applicationServerKey`.
    pub fn generate() -> Result<(String, String), VapidError> {
        let private = PrivateKey::generate(&ECDH_P256).map_err(|_| VapidError::KeyInvalid)?;
        let scalar: aws_lc_rs::encoding::EcPrivateKeyBin<'static> =
            private.as_be_bytes().map_err(|_| VapidError::KeyInvalid)?;
        let key = Self::from_scalar(scalar.as_ref())?;
        Ok((URL_SAFE_NO_PAD.encode(scalar.as_ref()), key.public_b64))
    }

    /// The uncompressed public key, base64url.
    pub fn public_key(&self) -> &str {
        &self.public_b64
    }

    /// A signed JWT for `aud`, valid until `exp`.
    pub fn sign_jwt(&self, aud: &str, sub: &str, exp: DateTime<Utc>) -> Result<String, VapidError> {
        let header = URL_SAFE_NO_PAD.encode(br#"{"typ":"JWT","alg":"ES256"}"#);
        let claims = serde_json::json!({ "aud": aud, "exp": exp.timestamp(), "sub": sub });
        let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
        let signing_input = format!("{header}.{claims}");
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let sig = self
            .pair
            .sign(&rng, signing_input.as_bytes())
            .map_err(|_| VapidError::Sign)?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(sig.as_ref())
        ))
    }
}

/// The VAPID `aud` for an endpoint: its origin, with the port only when it is not the default.
pub fn audience(endpoint: &reqwest::Url) -> Result<String, VapidError> {
    let origin = endpoint.origin();
    if origin.is_tuple() {
        Ok(origin.ascii_serialization())
    } else {
        Err(VapidError::Audience(endpoint.to_string()))
    }
}

/// Signs JWTs and keeps one per origin until it nears expiry.
pub struct VapidSigner {
    key: VapidKey,
    subject: String,
    /// Per origin: the whole `Authorization` value, and when its JWT expires.
    cache: Mutex<HashMap<String, (String, DateTime<Utc>)>>,
}

impl VapidSigner {
    pub fn new(key: VapidKey, subject: &str) -> Result<Self, VapidError> {
        if !(subject.starts_with("mailto:") || subject.starts_with("https:")) {
            return Err(VapidError::Subject(subject.to_owned()));
        }
        Ok(VapidSigner {
            key,
            subject: subject.to_owned(),
            cache: Mutex::new(HashMap::new()),
        })
    }

    pub fn public_key(&self) -> &str {
        self.key.public_key()
    }

    /// The `Authorization` header value for a request to `endpoint`, at time `now`.
    pub fn authorization(
        &self,
        endpoint: &reqwest::Url,
        now: DateTime<Utc>,
    ) -> Result<String, VapidError> {
        let aud = audience(endpoint)?;
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(&aud) {
            Some((header, exp)) if *exp - now > RENEW_BEFORE => Ok(header.clone()),
            _ => {
                let exp = now + JWT_LIFETIME;
                let jwt = self.key.sign_jwt(&aud, &self.subject, exp)?;
                let header = format!("vapid t={jwt}, k={}", self.key.public_key());
                cache.insert(aud, (header.clone(), exp));
                Ok(header)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lc_rs::signature::{ECDSA_P256_SHA256_FIXED, UnparsedPublicKey};

    fn claims(jwt: &str) -> serde_json::Value {
        let part = jwt.split('.').nth(1).unwrap();
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
    }

    fn verify(jwt: &str, public_b64: &str) -> bool {
        let (input, sig) = jwt.rsplit_once('.').unwrap();
        let public = URL_SAFE_NO_PAD.decode(public_b64).unwrap();
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, public)
            .verify(input.as_bytes(), &URL_SAFE_NO_PAD.decode(sig).unwrap())
            .is_ok()
    }

    fn url(s: &str) -> reqwest::Url {
        reqwest::Url::parse(s).unwrap()
    }

    #[test]
    fn audience_is_the_origin_with_a_non_default_port() {
        assert_eq!(
            audience(&url("https://fcm.googleapis.com/fcm/send/abc")).unwrap(),
            "https://fcm.googleapis.com"
        );
        assert_eq!(
            audience(&url("https://push.example:8443/x")).unwrap(),
            "https://push.example:8443"
        );
        assert_eq!(
            audience(&url("https://push.example:443/x")).unwrap(),
            "https://push.example"
        );
        assert!(
            audience(&url("mailto:ops@tidings.invalid")).is_err(),
            "no origin"
        );
    }

    #[test]
    fn a_generated_key_round_trips_and_signs_verifiable_tokens() {
        let (private, public) = VapidKey::generate().unwrap();
        let key = VapidKey::parse(&private).unwrap();
        assert_eq!(key.public_key(), public);
        assert_eq!(URL_SAFE_NO_PAD.decode(&public).unwrap().len(), 65);
        let exp = Utc::now() + JWT_LIFETIME;
        let jwt = key
            .sign_jwt("https://push.example", "mailto:ops@tidings.invalid", exp)
            .unwrap();
        assert!(verify(&jwt, &public));
        assert_eq!(claims(&jwt)["aud"], "https://push.example");
        assert_eq!(claims(&jwt)["sub"], "mailto:ops@tidings.invalid");
        assert_eq!(claims(&jwt)["exp"], exp.timestamp());
        assert!(
            !format!("{key:?}").contains(&private),
            "Debug must not print the private key"
        );
    }

    #[test]
    fn tokens_are_cached_per_origin_and_renewed_before_expiry() {
        let (private, _) = VapidKey::generate().unwrap();
        let signer = VapidSigner::new(
            VapidKey::parse(&private).unwrap(),
            "mailto:ops@tidings.invalid",
        )
        .unwrap();
        let t0 = Utc::now();
        let a = signer
            .authorization(&url("https://push.example/a"), t0)
            .unwrap();
        let b = signer
            .authorization(&url("https://push.example/b"), t0 + Duration::hours(10))
            .unwrap();
        assert_eq!(a, b, "same origin, still fresh: same token");
        let other = signer
            .authorization(&url("https://other.example/a"), t0)
            .unwrap();
        assert_ne!(a, other);
        let renewed = signer
            .authorization(
                &url("https://push.example/c"),
                t0 + Duration::hours(11) + Duration::minutes(1),
            )
            .unwrap();
        assert_ne!(a, renewed, "less than an hour left: a new token");
        assert!(a.starts_with("vapid t=") && a.ends_with(&format!(", k={}", signer.public_key())));
    }

    #[test]
    fn bad_keys_and_subjects_are_refused() {
        assert_eq!(VapidKey::parse("short").unwrap_err(), VapidError::KeyFormat);
        assert_eq!(
            VapidKey::parse(&URL_SAFE_NO_PAD.encode([0u8; 32])).unwrap_err(),
            VapidError::KeyInvalid
        );
        let (private, _) = VapidKey::generate().unwrap();
        assert!(
            VapidSigner::new(VapidKey::parse(&private).unwrap(), "ops@tidings.invalid").is_err()
        );
    }
}
