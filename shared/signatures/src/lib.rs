//! Standard Webhooks signatures: `webhook-signature` is `v1,` and the base64 HMAC-SHA256 of
//! `<webhook-id>.<webhook-timestamp>.<body>` under a secret written `whsec_<base64 of its bytes>`.
//! The dispatcher signs every webhook with it; the api verifies change hints with it.

use aws_lc_rs::hmac;
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// How far a message's timestamp may be from now, either way, by the specification's advice.
pub const TOLERANCE_SECS: u64 = 5 * 60;

/// A secret's key.
#[derive(Clone)]
pub struct Secret {
    key: hmac::Key,
}

/// Names nothing of the key.
impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a Standard Webhooks secret: write whsec_ and the base64 of 24 to 64 bytes")]
pub struct BadSecret;

/// Why a message is not taken as signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unverified {
    #[error("missing or malformed {0} header")]
    Header(&'static str),
    #[error("webhook-timestamp is more than 5 minutes from now")]
    Stale,
    #[error("no secret signs this message")]
    Signature,
}

impl Secret {
    pub fn parse(text: &str) -> Result<Self, BadSecret> {
        let bytes = text
            .trim()
            .strip_prefix("whsec_")
            .and_then(|b| STANDARD.decode(b).ok())
            .filter(|b| (24..=64).contains(&b.len()))
            .ok_or(BadSecret)?;
        Ok(Secret {
            key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
        })
    }

    /// A new secret of 32 random bytes, and how it is written (shown once to its owner).
    pub fn generate() -> Result<(Self, String), aws_lc_rs::error::Unspecified> {
        let mut bytes = [0u8; 32];
        SystemRandom::new().fill(&mut bytes)?;
        let text = format!("whsec_{}", STANDARD.encode(bytes));
        let secret = Secret::parse(&text).map_err(|_| aws_lc_rs::error::Unspecified)?;
        Ok((secret, text))
    }

    /// The `webhook-signature` value (one signature) for a message.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = hmac::sign(&self.key, &signed_content(id, &timestamp.to_string(), body));
        format!("v1,{}", STANDARD.encode(tag.as_ref()))
    }
}

fn signed_content(id: &str, timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(id.len() + timestamp.len() + body.len() + 2);
    for part in [id.as_bytes(), b".", timestamp.as_bytes(), b".", body] {
        content.extend_from_slice(part);
    }
    content
}

/// A message's three headers, as received.
#[derive(Debug, Clone, Copy)]
pub struct Headers<'a> {
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// Signatures one message may carry: a sender rotating its secret sends two; a handful leaves
/// room, and a header of thousands is refused before anything is hashed.
pub const MAX_SIGNATURES: usize = 5;
/// The longest `webhook-id` taken: ids are remembered to refuse replays, so their size is
/// bounded like everything else kept.
pub const MAX_ID_LEN: usize = 256;
/// An HMAC-SHA256 tag's length; a signature of any other length cannot match and is not decoded
/// past its length check.
const TAG_LEN: usize = 32;

/// Which of `secrets` (grouped, e.g. per source: the current one and one being rotated out)
/// signed `body` under `headers`, if its timestamp is within [`TOLERANCE_SECS`] of `now_unix`:
/// the group's index, and the message id.
///
/// What it costs is bounded before any hashing: at most [`MAX_SIGNATURES`] entries, each a
/// 32-byte tag, and one HMAC per configured secret, compared in constant time with every tag, so
/// an unauthenticated request costs the same whatever it carries.
pub fn verify<'a>(
    groups: &[&[Secret]],
    headers: Headers<'a>,
    body: &[u8],
    now_unix: i64,
) -> Result<(usize, &'a str), Unverified> {
    let present =
        |v: Option<&'a str>, name| v.filter(|v| !v.is_empty()).ok_or(Unverified::Header(name));
    let id = present(headers.id, "webhook-id")?;
    if id.len() > MAX_ID_LEN {
        return Err(Unverified::Header("webhook-id"));
    }
    let timestamp = present(headers.timestamp, "webhook-timestamp")?;
    let tags = tags(present(headers.signature, "webhook-signature")?)?;
    let at: i64 = timestamp
        .parse()
        .map_err(|_| Unverified::Header("webhook-timestamp"))?;
    if at.abs_diff(now_unix) > TOLERANCE_SECS {
        return Err(Unverified::Stale);
    }
    let content = signed_content(id, timestamp, body);
    groups
        .iter()
        .position(|group| {
            group.iter().any(|secret| {
                let expected = hmac::sign(&secret.key, &content);
                tags.iter().any(|tag| {
                    aws_lc_rs::constant_time::verify_slices_are_equal(expected.as_ref(), tag)
                        .is_ok()
                })
            })
        })
        .map(|group| (group, id))
        .ok_or(Unverified::Signature)
}

/// The 32-byte `v1` tags of a `webhook-signature` header (space-separated `v1,<base64>`; other
/// versions are not ours to read). More than [`MAX_SIGNATURES`] entries of any version, or none
/// of ours, is a malformed header.
fn tags(header: &str) -> Result<Vec<[u8; TAG_LEN]>, Unverified> {
    let malformed = Unverified::Header("webhook-signature");
    let mut entries = header.split(' ').filter(|e| !e.is_empty());
    let mut tags = Vec::new();
    for entry in entries.by_ref().take(MAX_SIGNATURES) {
        // Base64 of 32 bytes is 44 characters; anything else is no tag of ours.
        let Some(encoded) = entry.strip_prefix("v1,").filter(|e| e.len() == 44) else {
            continue;
        };
        let mut tag = [0u8; TAG_LEN];
        if let Ok(TAG_LEN) = STANDARD.decode_slice(encoded, &mut tag) {
            tags.push(tag);
        }
    }
    if entries.next().is_some() || tags.is_empty() {
        return Err(malformed);
    }
    Ok(tags)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification.
    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TS: i64 = 1614265330;
    const BODY: &[u8] = br#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn headers<'a>(id: &'a str, ts: &'a str, sig: &'a str) -> Headers<'a> {
        Headers {
            id: Some(id),
            timestamp: Some(ts),
            signature: Some(sig),
        }
    }

    #[test]
    fn the_specification_example_signs_and_verifies() {
        let secret = Secret::parse(SECRET).unwrap();
        assert_eq!(secret.sign(ID, TS, BODY), SIGNATURE);
        let ts = TS.to_string();
        assert_eq!(
            verify(&[&[secret]], headers(ID, &ts, SIGNATURE), BODY, TS),
            Ok((0, ID))
        );
    }

    #[test]
    fn what_differs_from_what_was_signed_is_refused() {
        let secrets = [Secret::parse(SECRET).unwrap()];
        let group: &[&[Secret]] = &[&secrets];
        let ts = TS.to_string();
        let good = headers(ID, &ts, SIGNATURE);
        let refused = |h, body: &[u8], now| verify(group, h, body, now).unwrap_err();
        assert_eq!(
            refused(good, br#"{"test": 2432232315}"#, TS),
            Unverified::Signature
        );
        assert_eq!(
            refused(headers("msg_other", &ts, SIGNATURE), BODY, TS),
            Unverified::Signature
        );
        assert_eq!(refused(good, BODY, TS + 301), Unverified::Stale);
        assert_eq!(refused(good, BODY, TS - 301), Unverified::Stale);
        let v2 = SIGNATURE.replacen("v1,", "v2,", 1);
        assert_eq!(
            refused(headers(ID, &ts, &v2), BODY, TS),
            Unverified::Header("webhook-signature")
        );
        let none = Headers {
            id: None,
            timestamp: None,
            signature: None,
        };
        assert_eq!(refused(none, BODY, TS), Unverified::Header("webhook-id"));
    }

    #[test]
    fn during_a_rotation_either_secret_signs_and_the_group_is_named() {
        let (new, text) = Secret::generate().unwrap();
        assert!(text.starts_with("whsec_") && Secret::parse(&text).is_ok());
        let old = Secret::parse(SECRET).unwrap();
        let both_keys = [new.clone(), old];
        let groups: &[&[Secret]] = &[std::slice::from_ref(&new), &both_keys];
        let ts = TS.to_string();
        // Two signatures, one by a key nobody here holds: the one that verifies is enough.
        let stranger = Secret::generate().unwrap().0.sign(ID, TS, BODY);
        let both = format!("{stranger} {SIGNATURE}");
        assert_eq!(
            verify(groups, headers(ID, &ts, &both), BODY, TS),
            Ok((1, ID))
        );
        let by_new = new.sign(ID, TS, BODY);
        assert_eq!(
            verify(groups, headers(ID, &ts, &by_new), BODY, TS),
            Ok((0, ID))
        );
    }

    #[test]
    fn a_header_of_many_or_malformed_signatures_is_refused_before_hashing() {
        let secrets = [Secret::parse(SECRET).unwrap()];
        let group: &[&[Secret]] = &[&secrets];
        let ts = TS.to_string();
        let malformed = Err(Unverified::Header("webhook-signature"));
        let many = vec!["v1,"; 100_000].join(" ");
        assert_eq!(verify(group, headers(ID, &ts, &many), BODY, TS), malformed);
        // The right signature after a handful of others is one too many.
        let sixth = format!("{} {SIGNATURE}", ["v1,AAAA"; MAX_SIGNATURES].join(" "));
        assert_eq!(verify(group, headers(ID, &ts, &sixth), BODY, TS), malformed);
        let fifth = format!("{} {SIGNATURE}", ["v1,AAAA"; MAX_SIGNATURES - 1].join(" "));
        assert_eq!(
            verify(group, headers(ID, &ts, &fifth), BODY, TS),
            Ok((0, ID))
        );
        // A tag that is not 32 bytes is no tag: 31 and 33 bytes.
        for len in [31, 33] {
            let short = format!("v1,{}", STANDARD.encode(vec![7u8; len]));
            assert_eq!(verify(group, headers(ID, &ts, &short), BODY, TS), malformed);
        }
        // What it costs: 100,000 entries over a 16 KB body (an HMAC per entry took a second).
        let body = vec![b'x'; 16 * 1024];
        let fastest = (0..5)
            .map(|_| {
                let started = std::time::Instant::now();
                let refused = verify(group, headers(ID, &ts, &many), &body, TS);
                assert_eq!(refused, malformed);
                started.elapsed()
            })
            .min()
            .unwrap();
        println!("100,000 signature entries refused in {fastest:?}");
        assert!(fastest < std::time::Duration::from_millis(1), "{fastest:?}");
        let long_id = "m".repeat(MAX_ID_LEN + 1);
        assert_eq!(
            verify(group, headers(&long_id, &ts, SIGNATURE), BODY, TS),
            Err(Unverified::Header("webhook-id"))
        );
    }

    #[test]
    fn secrets_are_whsec_and_24_to_64_bytes() {
        assert!(Secret::parse("whsec_c2hvcnQ=").is_err(), "5 bytes");
        assert!(
            Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err(),
            "no whsec_"
        );
        assert!(Secret::parse(&format!("whsec_{}", STANDARD.encode([1u8; 65]))).is_err());
        assert!(Secret::parse(&format!("whsec_{}", STANDARD.encode([1u8; 64]))).is_ok());
    }
}
