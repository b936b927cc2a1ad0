//! Web Push message encryption, RFC 8291 (`aes128gcm`, RFC 8188), on aws-lc-rs.
//!
//! For each message: an ephemeral P-256 key pair and a random 16-byte salt; ECDH with the user
//! agent's key; HKDF-SHA256 mixes in the subscription's auth secret, then derives the content key
//! and nonce; AES-128-GCM seals one record (`plaintext || 0x02`). The body is the RFC 8188 header
//! (`salt || rs || idlen || sender public key`) followed by that record. aws-lc-rs does this in
//! tens of microseconds where pure-Rust P-256 takes hundreds (docs/benchmarks.md has the figures).

use aws_lc_rs::agreement::{self, ECDH_P256, PrivateKey, UnparsedPublicKey};
use aws_lc_rs::{aead, hkdf};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// RFC 8188 record size we declare: one record carries the whole message.
pub const RECORD_SIZE: u32 = 4096;
/// The largest plaintext that fits one 4096-byte record: 4096 − 16 (tag) − 1 (delimiter) − 86
/// (header). Larger bodies are refused, never truncated.
pub const MAX_PLAINTEXT: usize = 3993;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("p256dh must be base64url")]
    P256dhEncoding,
    #[error("p256dh must be an uncompressed P-256 point (65 bytes starting 0x04), got {0} bytes")]
    P256dhShape(usize),
    #[error("p256dh is not a point on the P-256 curve")]
    P256dhNotOnCurve,
    #[error("auth must be base64url")]
    AuthEncoding,
    #[error("auth must be 16 bytes, got {0}")]
    AuthLength(usize),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncryptError {
    #[error("payload is {0} bytes; one Web Push record holds at most {MAX_PLAINTEXT}")]
    TooLarge(usize),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("encryption failed in the crypto library")]
    Crypto,
}

impl From<aws_lc_rs::error::Unspecified> for EncryptError {
    fn from(_: aws_lc_rs::error::Unspecified) -> Self {
        EncryptError::Crypto
    }
}

/// A subscription's keys, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UaKeys {
    pub public: [u8; 65],
    pub auth: [u8; 16],
}

impl UaKeys {
    /// Decodes `p256dh` and `auth` as browsers give them (base64url, padding tolerated). Checks
    /// the shape only; [`UaKeys::check_curve`] also proves the point is on the curve.
    pub fn parse(p256dh: &str, auth: &str) -> Result<Self, KeyError> {
        let public = URL_SAFE_NO_PAD
            .decode(p256dh.trim_end_matches('='))
            .map_err(|_| KeyError::P256dhEncoding)?;
        let public: [u8; 65] = match <[u8; 65]>::try_from(public.as_slice()) {
            Ok(p) if p[0] == 0x04 => p,
            _ => return Err(KeyError::P256dhShape(public.len())),
        };
        let auth = URL_SAFE_NO_PAD
            .decode(auth.trim_end_matches('='))
            .map_err(|_| KeyError::AuthEncoding)?;
        let auth =
            <[u8; 16]>::try_from(auth.as_slice()).map_err(|_| KeyError::AuthLength(auth.len()))?;
        Ok(UaKeys { public, auth })
    }

    /// Proves the point is on the curve by using it in a key agreement. The api calls this when
    /// a subscription is registered, so a bad key is refused there rather than at send time.
    pub fn check_curve(&self) -> Result<(), KeyError> {
        let probe = PrivateKey::generate(&ECDH_P256).map_err(|_| KeyError::P256dhNotOnCurve)?;
        agreement::agree(
            &probe,
            UnparsedPublicKey::new(&ECDH_P256, &self.public),
            KeyError::P256dhNotOnCurve,
            |_| Ok(()),
        )
    }
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn hkdf_sha256(
    salt: &[u8],
    ikm: &[u8],
    info: &[&[u8]],
    out: &mut [u8],
) -> Result<(), EncryptError> {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(ikm);
    prk.expand(info, Len(out.len()))?.fill(out)?;
    Ok(())
}

/// Encrypts `plaintext` for the subscription `keys`: the body of the push request.
pub fn encrypt(keys: &UaKeys, plaintext: &[u8]) -> Result<Vec<u8>, EncryptError> {
    let ephemeral = PrivateKey::generate(&ECDH_P256)?;
    let mut salt = [0u8; 16];
    aws_lc_rs::rand::fill(&mut salt)?;
    encrypt_with(keys, plaintext, &ephemeral, salt)
}

/// [`encrypt`] with the sender key and salt given, for the RFC's test vector.
pub fn encrypt_with(
    keys: &UaKeys,
    plaintext: &[u8],
    sender: &PrivateKey,
    salt: [u8; 16],
) -> Result<Vec<u8>, EncryptError> {
    if plaintext.len() > MAX_PLAINTEXT {
        return Err(EncryptError::TooLarge(plaintext.len()));
    }
    let sender_public = sender.compute_public_key()?;
    let sender_public = sender_public.as_ref();
    let ecdh_secret = agreement::agree(
        sender,
        UnparsedPublicKey::new(&ECDH_P256, &keys.public),
        EncryptError::Key(KeyError::P256dhNotOnCurve),
        |secret| Ok(secret.to_vec()),
    )?;

    // RFC 8291 §3.4: IKM = HKDF(auth_secret, ecdh_secret, "WebPush: info" || 0 || ua || as, 32)
    let mut ikm = [0u8; 32];
    hkdf_sha256(
        &keys.auth,
        &ecdh_secret,
        &[b"WebPush: info\0", &keys.public, sender_public],
        &mut ikm,
    )?;
    // RFC 8188 §2.2–2.3: content encryption key and nonce from the salt.
    let mut cek = [0u8; 16];
    hkdf_sha256(&salt, &ikm, &[b"Content-Encoding: aes128gcm\0"], &mut cek)?;
    let mut nonce = [0u8; 12];
    hkdf_sha256(&salt, &ikm, &[b"Content-Encoding: nonce\0"], &mut nonce)?;

    let key = aead::LessSafeKey::new(aead::UnboundKey::new(&aead::AES_128_GCM, &cek)?);
    let mut record = Vec::with_capacity(plaintext.len() + 1 + 16);
    record.extend_from_slice(plaintext);
    record.push(0x02); // last (and only) record, no padding
    key.seal_in_place_append_tag(
        aead::Nonce::assume_unique_for_key(nonce),
        aead::Aad::empty(),
        &mut record,
    )?;

    let mut body = Vec::with_capacity(16 + 4 + 1 + sender_public.len() + record.len());
    body.extend_from_slice(&salt);
    body.extend_from_slice(&RECORD_SIZE.to_be_bytes());
    body.push(u8::try_from(sender_public.len()).map_err(|_| EncryptError::Crypto)?);
    body.extend_from_slice(sender_public);
    body.extend_from_slice(&record);
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> Vec<u8> {
        URL_SAFE_NO_PAD.decode(s).unwrap()
    }

    /// RFC 8291 Appendix A.
    #[test]
    fn matches_the_rfc_8291_test_vector() {
        let keys = UaKeys::parse(
            "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
            "BTBZMqHH6r4Tts7J_aSIgg",
        )
        .unwrap();
        let sender = PrivateKey::from_private_key(
            &ECDH_P256,
            &b64("yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw"),
        )
        .unwrap();
        let salt: [u8; 16] = b64("DGv6ra1nlYgDCS1FRnbzlw").try_into().unwrap();
        let body = encrypt_with(
            &keys,
            b"When I grow up, I want to be a watermelon",
            &sender,
            salt,
        )
        .unwrap();
        assert_eq!(
            URL_SAFE_NO_PAD.encode(body),
            "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27ml\
             mlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPT\
             pK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN"
        );
    }

    #[test]
    fn each_message_gets_a_fresh_key_and_salt() {
        let keys = UaKeys::parse(
            "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
            "BTBZMqHH6r4Tts7J_aSIgg",
        )
        .unwrap();
        let a = encrypt(&keys, b"same").unwrap();
        let b = encrypt(&keys, b"same").unwrap();
        assert_ne!(a[..16], b[..16], "salt");
        assert_ne!(a[21..86], b[21..86], "sender key");
        assert_eq!(a.len(), 86 + 4 + 1 + 16);
    }

    #[test]
    fn the_largest_body_fits_one_record_and_one_more_byte_is_refused() {
        let keys = UaKeys::parse(
            "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
            "BTBZMqHH6r4Tts7J_aSIgg",
        )
        .unwrap();
        assert_eq!(
            encrypt(&keys, &[b'x'; MAX_PLAINTEXT]).unwrap().len(),
            RECORD_SIZE as usize
        );
        assert_eq!(
            encrypt(&keys, &[b'x'; MAX_PLAINTEXT + 1]),
            Err(EncryptError::TooLarge(MAX_PLAINTEXT + 1))
        );
    }

    #[test]
    fn bad_subscription_keys_are_named() {
        let good = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4";
        assert_eq!(
            UaKeys::parse("not base64!", "BTBZMqHH6r4Tts7J_aSIgg"),
            Err(KeyError::P256dhEncoding)
        );
        assert_eq!(
            UaKeys::parse("AAAA", "BTBZMqHH6r4Tts7J_aSIgg"),
            Err(KeyError::P256dhShape(3))
        );
        assert_eq!(UaKeys::parse(good, "AAAA"), Err(KeyError::AuthLength(3)));
        // Right shape, but (4, 0, 0) is not on the curve.
        let mut off = [0u8; 65];
        off[0] = 4;
        let keys = UaKeys::parse(&URL_SAFE_NO_PAD.encode(off), "BTBZMqHH6r4Tts7J_aSIgg").unwrap();
        assert_eq!(keys.check_curve(), Err(KeyError::P256dhNotOnCurve));
        UaKeys::parse(good, "BTBZMqHH6r4Tts7J_aSIgg")
            .unwrap()
            .check_curve()
            .unwrap();
    }
}
