//! Keys for the tests, and the independent verifier's word on a signed mail.

// Each test file that includes this uses part of it.
#![allow(dead_code)]

use aws_lc_rs::encoding::AsDer;
use aws_lc_rs::rsa::KeySize;
use aws_lc_rs::signature::RsaKeyPair;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use tidings_email::dkim::DkimKey;
use tidings_testkit::harness::tool;

/// dkimpy's verdict on `message`, with `record` as the selector's TXT record.
const VERIFY: &str = r#"
import sys, dkim
message = open(sys.argv[1], "rb").read()
record = sys.argv[2].encode()
def dns(name, timeout=5):
    assert name == sys.argv[3].encode() + b".", name
    return record
print("verified" if dkim.verify(message, dnsfunc=dns) else "refused")
"#;

pub fn verdict(message: &[u8], key: &DkimKey) -> String {
    let (name, record) = key.dns_record();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = std::env::temp_dir().join(format!("tidings-dkim-{}-{n}.eml", std::process::id()));
    std::fs::write(&file, message).unwrap();
    let out = std::process::Command::new(tool("python3").unwrap())
        .args(["-c", VERIFY])
        .arg(&file)
        .arg(record)
        .arg(name)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub fn pem(pkcs8: &[u8]) -> String {
    let body = STANDARD.encode(pkcs8);
    let lines: Vec<&str> = (body.as_bytes().chunks(64))
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    format!(
        "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
        lines.join("\n")
    )
}

/// A new RSA-2048 signing key for `tidings.test`, selector `mail2026`.
pub fn rsa_key() -> DkimKey {
    let rsa = RsaKeyPair::generate(KeySize::Rsa2048).expect("an RSA key");
    let pem = pem(rsa.as_der().expect("its PKCS#8").as_ref());
    DkimKey::from_pem(pem.as_bytes(), "tidings.test", "mail2026").expect("a DKIM key")
}
