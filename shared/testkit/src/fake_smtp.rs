//! A real SMTP server for tests: aiosmtpd (from the stack's tools), run as a child process. What
//! it answers depends on the recipient's local part, so one server plays every relay a test
//! needs:
//!
//! - `refused-…@`: `RCPT` answered `550 5.1.1` (no such mailbox);
//! - `refuse-later-…@`: as `refused-`, once one mail to it was accepted (a mailbox closed after
//!   its owner confirmed it);
//! - `defer-once-…@`: the content answered `451 4.3.0` the first time, `250` after;
//! - `defer-second-…@`: the same for the second mail (the first, a confirmation, goes);
//! - `refuse-content-…@`: the content answered `554 5.6.0`;
//! - `slow-…@`: the first mail to it kept, but answered 3 s late (past a client's timeout: it
//!   cannot know the mail arrived);
//! - anyone else: `250 2.0.0 Ok: queued as <n>`.
//!
//! Each accepted mail is kept as `<n>.eml` (the bytes received) beside `<n>.rcpt`.

use crate::brokers::free_port;
use crate::fake_push::CERT_PEM;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const KEY_PEM: &[u8] = include_bytes!("../../../tests/fixtures/tls/key.pem");

const SERVER: &str = r#"
import asyncio, os, ssl, sys, time
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult

port, folder, tls_cert, tls_key, login, sink = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6] == "sink"
implicit = sys.argv[7] == "implicit"

class Relay:
    def __init__(self):
        self.count = 0
        self.deferred = set()
        self.accepted = {}

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.startswith("refused-"):
            return "550 5.1.1 no such mailbox here"
        if address.startswith("refuse-later-") and self.accepted.get(address, 0) > 0:
            return "550 5.1.1 this mailbox is closed"
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server, session, envelope):
        rcpt = envelope.rcpt_tos[0]
        if rcpt.startswith("defer-once-") and rcpt not in self.deferred:
            self.deferred.add(rcpt)
            return "451 4.3.0 try again later"
        if rcpt.startswith("defer-second-") and self.accepted.get(rcpt, 0) == 1 and rcpt not in self.deferred:
            self.deferred.add(rcpt)
            return "451 4.3.0 try again later"
        if rcpt.startswith("refuse-content-"):
            return "554 5.6.0 content refused"
        self.count += 1
        if sink:
            return f"250 2.0.0 Ok: queued as {self.count}"
        first = rcpt not in self.accepted
        self.accepted[rcpt] = self.accepted.get(rcpt, 0) + 1
        with open(os.path.join(folder, f"{self.count}.eml"), "wb") as f:
            f.write(envelope.original_content)
        with open(os.path.join(folder, f"{self.count}.at"), "w") as f:
            f.write(str(int(time.time() * 1000)))
        with open(os.path.join(folder, f"{self.count}.rcpt"), "w") as f:
            f.write(rcpt)
        if rcpt.startswith("slow-") and first:
            await asyncio.sleep(3)
        return f"250 2.0.0 Ok: queued as {self.count}"

def authenticate(server, session, envelope, mechanism, auth_data):
    user, password = login.split(":", 1)
    ok = auth_data.login.decode() == user and auth_data.password.decode() == password
    # handled=False: the server answers a failure with 535 (handled=True would leave it to us).
    return AuthResult(success=ok, handled=False)

options = {}
if tls_cert != "-":
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls_cert, tls_key)
    options = dict(ssl_context=context) if implicit else dict(tls_context=context, require_starttls=True)
if login != "-":
    options.update(authenticator=authenticate, auth_require_tls=tls_cert != "-" and not implicit)
controller = Controller(Relay(), hostname="127.0.0.1", port=port, **options)
controller.start()
print("ready", flush=True)
try:
    sys.stdin.read()
finally:
    controller.stop()
"#;

/// aiosmtpd on a free port on 127.0.0.1, stopped when dropped.
pub struct FakeSmtp {
    pub port: u16,
    folder: PathBuf,
    child: Child,
}

/// What the server asks of its clients.
#[derive(Clone, Debug, Default)]
pub struct SmtpOptions {
    /// `STARTTLS` required, with the fixture certificate (`localhost`, `127.0.0.1`).
    pub starttls: bool,
    /// TLS from the first byte instead, with the same certificate.
    pub implicit_tls: bool,
    /// `AUTH` required, with this user and password.
    pub login: Option<(String, String)>,
    /// A benchmark's sink: every mail accepted, none kept.
    pub sink: bool,
}

impl FakeSmtp {
    pub fn start(options: &SmtpOptions) -> std::io::Result<Self> {
        let port = free_port().map_err(std::io::Error::other)?;
        let folder =
            std::env::temp_dir().join(format!("tidings-smtp-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&folder)?;
        let (cert, key) = (folder.join("cert.pem"), folder.join("key.pem"));
        std::fs::write(&cert, CERT_PEM)?;
        std::fs::write(&key, KEY_PEM)?;
        let tls = |path: &PathBuf| {
            if options.starttls || options.implicit_tls {
                path.display().to_string()
            } else {
                "-".to_owned()
            }
        };
        let login = options
            .login
            .as_ref()
            .map_or("-".to_owned(), |(u, p)| format!("{u}:{p}"));
        let python = crate::harness::tool("python3").map_err(std::io::Error::other)?;
        let mut child = Command::new(python)
            .args(["-c", SERVER])
            .arg(port.to_string())
            .arg(&folder)
            .arg(tls(&cert))
            .arg(tls(&key))
            .arg(login)
            .arg(if options.sink { "sink" } else { "keep" })
            .arg(if options.implicit_tls {
                "implicit"
            } else {
                "starttls"
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = child.kill();
            return Err(std::io::Error::other(format!(
                "aiosmtpd did not start: {line:?}"
            )));
        }
        Ok(FakeSmtp {
            port,
            folder,
            child,
        })
    }

    /// Each accepted mail, in order: its recipient and the bytes received.
    pub fn received(&self) -> Vec<(String, Vec<u8>)> {
        received_in(&self.folder)
    }

    /// Where it keeps what it accepted (another process reads it with [`received_in`]).
    pub fn folder(&self) -> &std::path::Path {
        &self.folder
    }
}

/// When each mail [`FakeSmtp::received`] lists was received (Unix ms), in the same order.
pub fn received_at(folder: &std::path::Path) -> Vec<i64> {
    (1..=received_in(folder).len())
        .map(|n| {
            std::fs::read_to_string(folder.join(format!("{n}.at")))
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0)
        })
        .collect()
}

/// Each mail a [`FakeSmtp`] keeping them in `folder` accepted, in order: its recipient and the
/// bytes received.
pub fn received_in(folder: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for n in 1.. {
        let Ok(bytes) = std::fs::read(folder.join(format!("{n}.eml"))) else {
            break;
        };
        let rcpt = std::fs::read_to_string(folder.join(format!("{n}.rcpt"))).unwrap_or_default();
        out.push((rcpt, bytes));
    }
    out
}

impl Drop for FakeSmtp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.folder);
    }
}
