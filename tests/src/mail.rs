//! Mails as an independent reader sees them: Python's `email` package parses them (headers
//! decoded, the text part's transfer encoding undone) and `dkimpy` verifies their DKIM
//! signature against the record `doctor` says to publish. For the email tests and the demo.

use crate::harness::tool;
use serde_json::Value;

/// A mail's headers and its text part.
#[derive(Debug, Clone)]
pub struct Read {
    pub headers: Vec<(String, String)>,
    pub text: String,
}

const READ: &str = "import sys, json, email, email.policy\n\
    m = email.message_from_bytes(open(sys.argv[1], 'rb').read(), policy=email.policy.default)\n\
    print(json.dumps({'headers': [[k, str(v)] for k, v in m.items()], 'text': m.get_body(('plain',)).get_content()}))";

const VERIFY: &str = "import sys, dkim\n\
    message = open(sys.argv[1], 'rb').read()\n\
    def dns(name, timeout=5):\n    assert name == sys.argv[3].encode() + b'.', name\n    return sys.argv[2].encode()\n\
    print('verified' if dkim.verify(message, dnsfunc=dns) else 'refused')";

/// `script`'s output on `message` (written to a file), with `args` after the file.
fn python(script: &str, message: &[u8], args: &[&str]) -> Result<String, String> {
    let file = std::env::temp_dir().join(format!("tidings-mail-{}.eml", uuid::Uuid::new_v4()));
    std::fs::write(&file, message).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(tool("python3").map_err(|e| e.to_string())?)
        .args(["-c", script])
        .arg(&file)
        .args(args)
        .output();
    let _ = std::fs::remove_file(&file);
    let out = out.map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

impl Read {
    pub fn of(message: &[u8]) -> Result<Read, String> {
        let v: Value =
            serde_json::from_str(&python(READ, message, &[])?).map_err(|e| e.to_string())?;
        let headers = (v["headers"].as_array().into_iter().flatten())
            .map(|h| {
                (
                    h[0].as_str().unwrap_or_default().to_owned(),
                    h[1].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let text = v["text"].as_str().unwrap_or_default().to_owned();
        Ok(Read { headers, text })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The first link in the text that starts with `start`.
    pub fn link(&self, start: &str) -> Option<String> {
        let at = self.text.find(start)?;
        self.text[at..].split_whitespace().next().map(str::to_owned)
    }
}

/// dkimpy's verdict (`verified` or `refused`) on `message`, with `record` published at `name`
/// as the only DNS it may ask.
pub fn dkim_verdict(message: &[u8], name: &str, record: &str) -> Result<String, String> {
    python(VERIFY, message, &[record, name])
}

/// The record `doctor` says to publish (its `dkim` check: `publish TXT <name> "<record>" …`).
pub fn published(doctor_detail: &str) -> Option<(String, String)> {
    let rest = doctor_detail.strip_prefix("publish TXT ")?;
    let (name, rest) = rest.split_once(' ')?;
    let record = rest.strip_prefix('"')?.split('"').next()?;
    Some((name.to_owned(), record.to_owned()))
}
