//! DKIM signatures (RFC 6376) with `relaxed/relaxed` canonicalization: RSA-SHA256, or
//! Ed25519-SHA256 (RFC 8463), under a PKCS#8 key the operator gives as a PEM file.

use aws_lc_rs::digest::{SHA256, digest};
use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair, RSA_PKCS1_SHA256, RsaKeyPair};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chrono::{DateTime, Utc};
use rustls_pki_types::PrivateKeyDer;
use rustls_pki_types::pem::PemObject;

/// The headers signed, when the mail has them: who and what, and the unsubscribe headers,
/// which RFC 8058 requires a valid signature to cover.
pub const SIGNED: &[&str] = &[
    "from",
    "to",
    "subject",
    "date",
    "message-id",
    "mime-version",
    "content-type",
    "auto-submitted",
    "list-unsubscribe",
    "list-unsubscribe-post",
];

#[derive(Debug, thiserror::Error)]
pub enum DkimError {
    #[error("the DKIM key is not a private key in PEM: {0}")]
    Pem(#[source] rustls_pki_types::pem::Error),
    #[error("the DKIM key is not PKCS#8 (`BEGIN PRIVATE KEY`)")]
    NotPkcs8,
    #[error("the DKIM key is neither an RSA (2048 bits or more) nor an Ed25519 key")]
    Key,
    #[error("{which} {value:?} may hold only letters, digits, dots and dashes")]
    Name { which: &'static str, value: String },
    #[error("the message has no blank line between its headers and its body")]
    NoBody,
    #[error("the message's headers are not ASCII (RFC 5322 asks it; lettre encodes them so)")]
    Headers,
    #[error("signing failed")]
    Sign,
}

enum Signer {
    Rsa(RsaKeyPair),
    Ed25519(Ed25519KeyPair),
}

/// A signing key, with the domain (`d=`) and selector (`s=`) it is published under.
pub struct DkimKey {
    signer: Signer,
    domain: String,
    selector: String,
}

/// A new Ed25519 signing key as a PKCS#8 PEM (`tidings-api dkim-keygen` prints one).
pub fn generate_ed25519_pem() -> Result<String, DkimError> {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&aws_lc_rs::rand::SystemRandom::new())
        .map_err(|_| DkimError::Key)?;
    let body = STANDARD.encode(pkcs8.as_ref());
    let lines: Vec<&str> = (body.as_bytes().chunks(64))
        .filter_map(|c| std::str::from_utf8(c).ok())
        .collect();
    Ok(format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        lines.join("\n")
    ))
}

impl DkimKey {
    /// Reads a PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`) holding an RSA or Ed25519 key.
    pub fn from_pem(pem: &[u8], domain: &str, selector: &str) -> Result<Self, DkimError> {
        name("domain", domain)?;
        name("selector", selector)?;
        let der = PrivateKeyDer::from_pem_slice(pem).map_err(DkimError::Pem)?;
        let PrivateKeyDer::Pkcs8(der) = der else {
            return Err(DkimError::NotPkcs8);
        };
        let bytes = der.secret_pkcs8_der();
        let signer = match RsaKeyPair::from_pkcs8(bytes) {
            Ok(rsa) if rsa.public_modulus_len() >= 256 => Signer::Rsa(rsa),
            Ok(_) => return Err(DkimError::Key),
            Err(_) => Ed25519KeyPair::from_pkcs8_maybe_unchecked(bytes)
                .map(Signer::Ed25519)
                .map_err(|_| DkimError::Key)?,
        };
        Ok(DkimKey {
            signer,
            domain: domain.to_owned(),
            selector: selector.to_owned(),
        })
    }

    /// The TXT record to publish at `<selector>._domainkey.<domain>`.
    pub fn dns_record(&self) -> (String, String) {
        let (k, public) = match &self.signer {
            // RSA: the SubjectPublicKeyInfo; Ed25519: the bare 32 bytes (RFC 8463).
            Signer::Rsa(rsa) => (
                "rsa",
                rsa.public_key()
                    .as_der()
                    .map(|d| STANDARD.encode(d.as_ref()))
                    .unwrap_or_default(),
            ),
            Signer::Ed25519(ed) => ("ed25519", STANDARD.encode(ed.public_key().as_ref())),
        };
        (
            format!("{}._domainkey.{}", self.selector, self.domain),
            format!("v=DKIM1; k={k}; p={public}"),
        )
    }

    /// `message` (as [`crate::message::compose`] formats it) with its `DKIM-Signature` first.
    pub fn sign(&self, message: &[u8], now: DateTime<Utc>) -> Result<Vec<u8>, DkimError> {
        let split = find(message, b"\r\n\r\n").ok_or(DkimError::NoBody)?;
        let (head, body) = (&message[..split + 2], &message[split + 4..]);
        let head = std::str::from_utf8(head).map_err(|_| DkimError::Headers)?;
        let fields = fields(head);
        let mut names = Vec::new();
        let mut signed = Vec::new();
        for wanted in SIGNED {
            // The last instance of a name is the one signed (RFC 6376 §5.4.2); these occur once.
            if let Some(field) = fields
                .iter()
                .rev()
                .find(|f| f.name.eq_ignore_ascii_case(wanted))
            {
                names.push(*wanted);
                signed.extend_from_slice(relaxed_header(field.name, field.value).as_bytes());
            }
        }
        let body_hash = STANDARD.encode(digest(&SHA256, &relaxed_body(body)));
        let algorithm = match self.signer {
            Signer::Rsa(_) => "rsa-sha256",
            Signer::Ed25519(_) => "ed25519-sha256",
        };
        let unsigned = format!(
            "v=1; a={algorithm}; c=relaxed/relaxed; d={}; s={}; t={}; h={}; bh={body_hash}; b=",
            self.domain,
            self.selector,
            now.timestamp(),
            names.join(":")
        );
        // The signature header itself, with `b=` empty and no line end, ends the signed data.
        let own = relaxed_header("DKIM-Signature", &unsigned);
        signed.extend_from_slice(own.trim_end_matches("\r\n").as_bytes());
        let signature = self.signature(&signed)?;
        let mut out = format!(
            "DKIM-Signature: {unsigned}{}\r\n",
            STANDARD.encode(signature)
        )
        .into_bytes();
        out.extend_from_slice(message);
        Ok(out)
    }

    fn signature(&self, data: &[u8]) -> Result<Vec<u8>, DkimError> {
        match &self.signer {
            Signer::Rsa(rsa) => {
                let mut out = vec![0; rsa.public_modulus_len()];
                rsa.sign(&RSA_PKCS1_SHA256, &SystemRandom::new(), data, &mut out)
                    .map_err(|_| DkimError::Sign)?;
                Ok(out)
            }
            // RFC 8463: Ed25519 signs the SHA-256 of the data.
            Signer::Ed25519(ed) => Ok(ed.sign(digest(&SHA256, data).as_ref()).as_ref().to_vec()),
        }
    }
}

/// A header field as it stands in the message: its name and its raw value, folding included.
struct Field<'a> {
    name: &'a str,
    value: &'a str,
}

/// The header fields of `head` (each line ending CRLF; a line starting with a space or tab
/// continues the field before it).
fn fields(head: &str) -> Vec<Field<'_>> {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    let mut at = 0;
    for line in head.split_inclusive("\r\n") {
        match spans.last_mut() {
            Some(span) if line.starts_with([' ', '\t']) => span.1 = at + line.len(),
            _ => spans.push((at, at + line.len())),
        }
        at += line.len();
    }
    (spans.into_iter())
        .filter_map(|(from, to)| head[from..to].split_once(':'))
        .map(|(name, value)| Field { name, value })
        .collect()
}

/// RFC 6376 §3.4.2: the name lower-cased, the value unfolded, runs of white space one space,
/// none at either end of the value; `name:value` and CRLF.
fn relaxed_header(name: &str, value: &str) -> String {
    let unfolded = value.replace("\r\n", "");
    let value = squeeze(&unfolded);
    format!("{}:{}\r\n", name.trim().to_ascii_lowercase(), value.trim())
}

/// RFC 6376 §3.4.4: each line's runs of white space one space and none at its end; the empty
/// lines at the end gone; a non-empty body ends with CRLF.
fn relaxed_body(body: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(body);
    let mut lines: Vec<String> = text
        .split("\r\n")
        .map(|line| squeeze(line).trim_end().to_owned())
        .collect();
    while lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    let mut out = String::new();
    for line in lines {
        out.push_str(&line);
        out.push_str("\r\n");
    }
    out.into_bytes()
}

/// Runs of spaces and tabs as one space.
fn squeeze(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut space = false;
    for c in s.chars() {
        if c == ' ' || c == '\t' {
            if !space {
                out.push(' ');
            }
            space = true;
        } else {
            out.push(c);
            space = false;
        }
    }
    out
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A domain or selector: it is written into the signature and a DNS name as it is.
fn name(which: &'static str, value: &str) -> Result<(), DkimError> {
    let fine = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    if fine {
        Ok(())
    } else {
        Err(DkimError::Name {
            which,
            value: value.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6376 §3.4.5's example.
    #[test]
    fn relaxed_canonicalization_as_the_rfc_shows_it() {
        let head = "A: X\r\nB : Y\t\r\n\tZ  \r\n";
        let canon: String = (fields(head).iter())
            .map(|f| relaxed_header(f.name, f.value))
            .collect();
        assert_eq!(canon, "a:X\r\nb:Y Z\r\n");
        assert_eq!(relaxed_body(b" C \r\nD \t E\r\n\r\n\r\n"), b" C\r\nD E\r\n");
        assert_eq!(relaxed_body(b""), b"");
        assert_eq!(relaxed_body(b"no line end"), b"no line end\r\n");
    }

    #[test]
    fn a_domain_or_selector_cannot_carry_a_tag() {
        let pem = b"-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n";
        for (domain, selector) in [("t.test; b=x", "s"), ("t.test", "s\r\nx"), ("", "s")] {
            assert!(matches!(
                DkimKey::from_pem(pem, domain, selector),
                Err(DkimError::Name { .. })
            ));
        }
        assert!(matches!(
            DkimKey::from_pem(b"not pem", "t.test", "s"),
            Err(DkimError::Pem(_))
        ));
        let pkcs1 = b"-----BEGIN RSA PRIVATE KEY-----\nMAA=\n-----END RSA PRIVATE KEY-----\n";
        assert!(matches!(
            DkimKey::from_pem(pkcs1, "t.test", "s"),
            Err(DkimError::NotPkcs8)
        ));
    }
}
