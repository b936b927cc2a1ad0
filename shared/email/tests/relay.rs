//! Submission to a real SMTP server (aiosmtpd): accepted with its queue id, deferred then taken,
//! a mailbox refused at `RCPT`, content refused, STARTTLS with AUTH, implicit TLS, a relay that
//! does not offer the STARTTLS it must, one that goes silent and one that talks without end.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use std::time::Duration;
use tidings_email::relay::{Relay, RelaySettings, Security, Submitted};
use tidings_testkit::fake_push::CERT_PEM;
use tidings_testkit::fake_smtp::{FakeSmtp, SmtpOptions};

fn settings(port: u16, security: Security) -> RelaySettings {
    RelaySettings {
        host: "localhost".into(),
        port,
        security,
        credentials: None,
        hello: "tidings.test".into(),
        timeout: Duration::from_secs(5),
        roots_pem: Some(CERT_PEM.to_vec()),
        idle: 2,
    }
}

const MAIL: &[u8] =
    b"From: a@tidings.test\r\nTo: b@example.test\r\nSubject: hi\r\n\r\n.leading dot\r\nbody\r\n";

/// A submission's kind and code, to compare in a table.
fn kind(s: &Submitted) -> (&'static str, Option<u16>) {
    match *s {
        Submitted::Accepted { .. } => ("accepted", None),
        Submitted::Deferred { code, .. } => ("deferred", code),
        Submitted::MailboxRefused { code, .. } => ("mailbox refused", Some(code)),
        Submitted::Refused { code, .. } => ("refused", Some(code)),
        Submitted::Unknown { .. } => ("unknown", None),
    }
}

/// One mail through a new relay with `settings`.
async fn once(settings: RelaySettings) -> Submitted {
    let relay = Relay::new(settings).unwrap();
    relay
        .submit("a@tidings.test", "b@example.test", MAIL)
        .await
        .unwrap()
}

#[tokio::test]
async fn each_answer_of_a_real_relay_is_told_apart() {
    let smtp = FakeSmtp::start(&SmtpOptions::default()).unwrap();
    let relay = Relay::new(settings(smtp.port, Security::Plain)).unwrap();
    let from = "alerts@tidings.test";

    let taken = relay.submit(from, "b@example.test", MAIL).await.unwrap();
    assert_eq!(
        taken,
        Submitted::Accepted {
            reply: "2.0.0 Ok: queued as 1".into()
        }
    );
    // Deferred once, then taken (on the kept connection); a mailbox refused at RCPT; the
    // content refused.
    let cases = [
        ("defer-once-c@example.test", ("deferred", Some(451))),
        ("defer-once-c@example.test", ("accepted", None)),
        ("refused-d@example.test", ("mailbox refused", Some(550))),
        ("refuse-content-e@example.test", ("refused", Some(554))),
    ];
    for (to, expected) in cases {
        let got = relay.submit(from, to, MAIL).await.unwrap();
        assert_eq!(kind(&got), expected, "{to}: {got:?}");
    }

    // What arrived is what was sent, the leading dot unstuffed by the server (lettre ends the
    // data with CRLF . CRLF after the mail's own last CRLF: one empty line more, which DKIM's
    // relaxed body ignores).
    let received = smtp.received();
    let rcpts: Vec<&str> = received.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(rcpts, ["b@example.test", "defer-once-c@example.test"]);
    assert_eq!(received[0].1.strip_suffix(b"\r\n"), Some(MAIL));

    // An address with a line break is refused before anything is sent.
    assert!(
        relay
            .submit(from, "x@y.test\r\nRCPT TO:<z@y.test>", MAIL)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn starttls_and_auth_are_used_and_required() {
    let login = ("tidings".to_owned(), "s3cret".to_owned());
    let smtp = FakeSmtp::start(&SmtpOptions {
        starttls: true,
        login: Some(login.clone()),
        ..SmtpOptions::default()
    })
    .unwrap();
    let mut with_login = settings(smtp.port, Security::StartTls);
    with_login.credentials = Some(login);
    let relay = Relay::new(with_login.clone()).unwrap();
    let taken = relay
        .submit("a@tidings.test", "b@example.test", MAIL)
        .await
        .unwrap();
    assert!(matches!(taken, Submitted::Accepted { .. }), "{taken:?}");

    // A wrong password: the relay says no (535), nothing is sent, and it is not a mailbox's fault.
    let mut wrong = with_login;
    wrong.credentials = Some(("tidings".into(), "wrong".into()));
    let refused = once(wrong).await;
    assert_eq!(kind(&refused), ("refused", Some(535)), "{refused:?}");
    assert_eq!(smtp.received().len(), 1);

    // STARTTLS required of a relay that does not offer it: not talked to in the clear.
    let plain = FakeSmtp::start(&SmtpOptions::default()).unwrap();
    let deferred = once(settings(plain.port, Security::StartTls)).await;
    assert_eq!(kind(&deferred), ("deferred", None), "{deferred:?}");
    assert!(plain.received().is_empty());
}

/// A relay that takes the data and then never answers: the mail may have been taken, so it is
/// `Unknown` (a retry could send it twice); one that never greets is deferred. Both within the
/// timeout.
#[tokio::test]
async fn a_silent_relay_is_bounded_by_the_timeout() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read).lines();
                write.write_all(b"220 silent.test\r\n").await.unwrap();
                let mut in_data = false;
                while let Ok(Some(line)) = lines.next_line().await {
                    let reply: &[u8] = match line.get(..4).unwrap_or(&line) {
                        _ if in_data => continue,
                        "EHLO" => b"250 silent.test\r\n",
                        "DATA" => {
                            in_data = true;
                            b"354 go on\r\n"
                        }
                        _ => b"250 ok\r\n",
                    };
                    write.write_all(reply).await.unwrap();
                }
            });
        }
    });
    let mut quick = settings(port, Security::Plain);
    quick.timeout = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let silent = once(quick).await;
    assert_eq!(kind(&silent), ("unknown", None), "{silent:?}");
    assert!(started.elapsed() < Duration::from_secs(2));

    let mute = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut quick = settings(mute.local_addr().unwrap().port(), Security::Plain);
    quick.timeout = Duration::from_millis(300);
    let deferred = once(quick).await;
    assert_eq!(kind(&deferred), ("deferred", None), "{deferred:?}");
}

/// Implicit TLS (port 465's way): the greeting comes encrypted, the login after it, on a
/// connection kept for the next mail.
#[tokio::test]
async fn implicit_tls_and_auth_are_used() {
    let login = ("tidings".to_owned(), "s3cret".to_owned());
    let smtp = FakeSmtp::start(&SmtpOptions {
        implicit_tls: true,
        login: Some(login.clone()),
        ..SmtpOptions::default()
    })
    .unwrap();
    let mut implicit = settings(smtp.port, Security::Implicit);
    implicit.credentials = Some(login);
    let relay = Relay::new(implicit.clone()).unwrap();
    for to in ["b@example.test", "c@example.test"] {
        let taken = relay.submit("a@tidings.test", to, MAIL).await.unwrap();
        assert!(matches!(taken, Submitted::Accepted { .. }), "{taken:?}");
    }
    assert_eq!(smtp.received().len(), 2);
    // The same server spoken to in the clear is not a relay: nothing is sent.
    let mut clear = settings(smtp.port, Security::Plain);
    clear.timeout = Duration::from_millis(500);
    let clear = once(clear).await;
    assert_eq!(kind(&clear).0, "deferred", "{clear:?}");
    assert_eq!(smtp.received().len(), 2);
}

/// A relay that sends without end (a greeting that never ends its line, or an answer to the
/// content that never does) is cut off once it has sent a mail's budget of bytes, long before
/// the timeout: before the content it is deferred, after it unknown. Without the budget the
/// first case read for the whole timeout, growing one line in memory.
#[tokio::test]
async fn a_relay_that_talks_without_end_is_cut_off_at_its_budget() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    async fn flood(write: &mut tokio::net::tcp::OwnedWriteHalf, start: &[u8]) {
        let chunk = vec![b'x'; 64 * 1024];
        let _ = write.write_all(start).await;
        while write.write_all(&chunk).await.is_ok() {}
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut greeted = false;
        while let Ok((socket, _)) = listener.accept().await {
            let (read, mut write) = socket.into_split();
            if !greeted {
                greeted = true;
                tokio::spawn(async move { flood(&mut write, b"220 ").await });
                continue;
            }
            tokio::spawn(async move {
                let mut lines = BufReader::new(read).lines();
                write.write_all(b"220 talkative.test\r\n").await.unwrap();
                while let Ok(Some(line)) = lines.next_line().await {
                    let reply: &[u8] = match line.get(..4).unwrap_or(&line) {
                        "EHLO" => b"250 talkative.test\r\n",
                        "DATA" => b"354 go on\r\n",
                        "." => return flood(&mut write, b"250 ").await,
                        _ if line.starts_with("MAIL") || line.starts_with("RCPT") => b"250 ok\r\n",
                        _ => continue,
                    };
                    write.write_all(reply).await.unwrap();
                }
            });
        }
    });
    let mut patient = settings(port, Security::Plain);
    patient.timeout = Duration::from_secs(30);
    for expected in ["deferred", "unknown"] {
        let started = std::time::Instant::now();
        let cut = once(patient.clone()).await;
        assert_eq!(kind(&cut).0, expected, "{cut:?}");
        let (Submitted::Deferred { reply, .. } | Submitted::Unknown { reply }) = &cut else {
            unreachable!()
        };
        assert!(reply.contains("more than 262144 bytes"), "{reply}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}
