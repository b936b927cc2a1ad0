//! One notification as a mail, as bytes ready for SMTP (CRLF line ends, no line over 998).

use chrono::{DateTime, Utc};
use lettre::Message;
use lettre::message::header::{HeaderName, HeaderValue};
use lettre::message::{Mailbox, MultiPart};

/// What a mail says and to whom. Every string may come from outside (an item's name in the
/// subject, an address a stranger typed): none of it can add a header.
#[derive(Clone, Debug)]
pub struct Mail<'a> {
    /// The sender, e.g. `Tidings <alerts@tidings.example>`.
    pub from: &'a str,
    pub to: &'a str,
    pub subject: &'a str,
    pub text: &'a str,
    pub html: &'a str,
    /// Names the mail for its outbox row: `<{id}@{domain}>`, the same on every attempt, so a
    /// relay or a reader sees a retried mail as the same message.
    pub message_id: MessageId<'a>,
    pub unsubscribe: Unsubscribe<'a>,
    pub date: DateTime<Utc>,
}

/// A mail's `Message-ID`: an id and the sending domain.
#[derive(Clone, Copy, Debug)]
pub struct MessageId<'a> {
    pub id: &'a str,
    pub domain: &'a str,
}

/// Where a reader leaves: a link that takes a one-click POST (RFC 8058), and a mailto.
#[derive(Clone, Copy, Debug)]
pub struct Unsubscribe<'a> {
    pub https: &'a str,
    pub mailto: &'a str,
}

#[derive(Debug, thiserror::Error)]
pub enum MailError {
    #[error("{which} address {value:?} is not an address")]
    Address {
        which: &'static str,
        value: String,
        #[source]
        source: lettre::address::AddressError,
    },
    #[error("{which} {value:?} may hold only printable ASCII without spaces or angle brackets")]
    Unsafe { which: &'static str, value: String },
    #[error("the mail could not be built")]
    Build(#[from] lettre::error::Error),
}

/// The mail, formatted: headers, then `multipart/alternative` text and HTML.
pub fn compose(mail: &Mail<'_>) -> Result<Vec<u8>, MailError> {
    let from: Mailbox = mail.from.parse().map_err(|source| MailError::Address {
        which: "from",
        value: mail.from.to_owned(),
        source,
    })?;
    let to: Mailbox = mail.to.parse().map_err(|source| MailError::Address {
        which: "to",
        value: mail.to.to_owned(),
        source,
    })?;
    let id = mail.message_id;
    safe("message id", id.id)?;
    safe("message id domain", id.domain)?;
    safe("unsubscribe link", mail.unsubscribe.https)?;
    safe("unsubscribe address", mail.unsubscribe.mailto)?;
    let unsubscribe = format!(
        "<{}>, <mailto:{}>",
        mail.unsubscribe.https, mail.unsubscribe.mailto
    );
    let message = Message::builder()
        .from(from)
        .to(to)
        .subject(mail.subject)
        .date(mail.date.into())
        .message_id(Some(format!("<{}@{}>", id.id, id.domain)))
        .raw_header(header("Auto-Submitted", "auto-generated"))
        .raw_header(header("List-Unsubscribe", &unsubscribe))
        .raw_header(header(
            "List-Unsubscribe-Post",
            "List-Unsubscribe=One-Click",
        ))
        .multipart(MultiPart::alternative_plain_html(
            mail.text.to_owned(),
            mail.html.to_owned(),
        ))?;
    Ok(message.formatted())
}

fn header(name: &'static str, value: &str) -> HeaderValue {
    HeaderValue::new(HeaderName::new_from_ascii_str(name), value.to_owned())
}

/// A value written into a header as it is (inside `<…>`): printable ASCII, no space, no `<`
/// or `>`, so it can neither end its header nor its angle brackets.
fn safe(which: &'static str, value: &str) -> Result<(), MailError> {
    let fine = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'<' && b != b'>');
    if fine {
        Ok(())
    } else {
        Err(MailError::Unsafe {
            which,
            value: value.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn mail<'a>(subject: &'a str, to: &'a str, https: &'a str) -> Mail<'a> {
        Mail {
            from: "Tidings <alerts@tidings.test>",
            to,
            subject,
            text: "SKU-1 is 9.99 EUR, as of 09:00, holds until 10:00.",
            html: "<p>SKU-1 is <b>9.99 EUR</b></p>",
            message_id: MessageId {
                id: "0192e4a1-7b3c-7d2e-9f10-3a4b5c6d7e8f",
                domain: "tidings.test",
            },
            unsubscribe: Unsubscribe {
                https,
                mailto: "unsubscribe@tidings.test",
            },
            date: Utc.with_ymd_and_hms(2026, 12, 5, 9, 0, 0).unwrap(),
        }
    }

    /// The header names of a formatted mail, in order, folding undone.
    fn header_names(bytes: &[u8]) -> Vec<String> {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let head = text.split("\r\n\r\n").next().unwrap();
        (head.split("\r\n"))
            .filter(|l| !l.starts_with([' ', '\t']))
            .map(|l| l.split(':').next().unwrap().to_owned())
            .collect()
    }

    const HEADERS: [&str; 10] = [
        "From",
        "To",
        "Subject",
        "Date",
        "Message-ID",
        "Auto-Submitted",
        "List-Unsubscribe",
        "List-Unsubscribe-Post",
        "MIME-Version",
        "Content-Type",
    ];

    #[test]
    fn a_mail_carries_its_row_its_unsubscribe_and_both_parts() {
        let bytes = compose(&mail(
            "SKU-1 now 9.99 EUR",
            "a@b.test",
            "https://t.test/u/1",
        ))
        .unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        let mut names = header_names(&bytes);
        names.sort();
        let mut expected: Vec<String> = HEADERS.iter().map(|h| (*h).to_owned()).collect();
        expected.sort();
        assert_eq!(names, expected, "{text}");
        for line in [
            "Message-ID: <0192e4a1-7b3c-7d2e-9f10-3a4b5c6d7e8f@tidings.test>",
            "Auto-Submitted: auto-generated",
            "List-Unsubscribe: <https://t.test/u/1>, <mailto:unsubscribe@tidings.test>",
            "List-Unsubscribe-Post: List-Unsubscribe=One-Click",
            "Content-Type: multipart/alternative;",
            "Content-Type: text/plain; charset=utf-8",
            "Content-Type: text/html; charset=utf-8",
        ] {
            assert!(text.contains(line), "{line} missing from {text}");
        }
        assert!(text.lines().all(|l| l.len() <= 998));
    }

    #[test]
    fn no_item_name_or_address_adds_a_header() {
        for hostile in [
            "SKU\r\nBcc: victim@evil.test",
            "SKU\nBcc: victim@evil.test",
            "SKU\rBcc: victim@evil.test",
            "Tee \u{2028}\u{85}Bcc: x",
            "Ténèbres — 東京 \r\n\r\n<script>",
        ] {
            let bytes = compose(&mail(hostile, "a@b.test", "https://t.test/u/1")).unwrap();
            let names = header_names(&bytes);
            assert!(
                !names.iter().any(|n| n.eq_ignore_ascii_case("bcc")),
                "{hostile:?}"
            );
            assert_eq!(names.len(), HEADERS.len(), "{hostile:?}: {names:?}");
            let text = String::from_utf8(bytes).unwrap();
            let subject = (text.lines())
                .skip_while(|l| !l.starts_with("Subject:"))
                .take_while(|l| l.starts_with("Subject:") || l.starts_with(' '))
                .collect::<String>();
            assert!(
                subject.is_ascii() && subject.contains("=?utf-8?"),
                "{subject}"
            );
        }
        for to in [
            "a@b.test\r\nBcc: c@d.test",
            "a@b.test, c@d.test",
            "a@b.test>\r\n",
        ] {
            assert!(
                matches!(
                    compose(&mail("x", to, "https://t.test/u/1")),
                    Err(MailError::Address { .. })
                ),
                "{to:?}"
            );
        }
        for link in [
            "https://t.test/u/1>, <https://evil.test",
            "https://t.test/ u",
            "",
        ] {
            assert!(
                matches!(
                    compose(&mail("x", "a@b.test", link)),
                    Err(MailError::Unsafe { .. })
                ),
                "{link:?}"
            );
        }
    }
}

/// Why an address a stranger typed is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadAddress {
    #[error("an address is at most 254 characters")]
    TooLong,
    #[error("not an address (write local@domain, without a name or angle brackets)")]
    Syntax,
    #[error("the domain must be a name with a dot, not an address literal or a local name")]
    Domain,
}

/// An address as Tidings keeps it, and its domain: one bare `local@domain` (no display name,
/// comment or second address), at most 254 characters (RFC 5321's path limit), lowercased (so
/// limits count one mailbox once), its domain a name with a dot.
pub fn parse_address(text: &str) -> Result<(String, String), BadAddress> {
    // Measured as sent, before trimming: the api's schema bounds the field as given.
    if text.len() > 254 {
        return Err(BadAddress::TooLong);
    }
    let text = text.trim();
    let lower = text.to_lowercase();
    let address: lettre::Address = lower.parse().map_err(|_| BadAddress::Syntax)?;
    let domain = address.domain();
    let named = domain.contains('.')
        && !domain.starts_with('[')
        && !domain.ends_with('.')
        && domain.parse::<std::net::IpAddr>().is_err();
    if !named {
        return Err(BadAddress::Domain);
    }
    let domain = domain.to_owned();
    Ok((address.to_string(), domain))
}

#[cfg(test)]
mod address_tests {
    use super::*;

    #[test]
    fn an_address_is_one_bare_mailbox_at_a_named_domain() {
        assert_eq!(
            parse_address(" Ann.Lee@Example.COM ").unwrap(),
            ("ann.lee@example.com".into(), "example.com".into())
        );
        for bad in [
            "",
            "ann",
            "Ann <ann@example.com>",
            "ann@example.com, bob@example.com",
            "ann@example.com\r\nBcc: x@y.z",
            "ann@",
            "@example.com",
        ] {
            assert_eq!(parse_address(bad), Err(BadAddress::Syntax), "{bad:?}");
        }
        for bad in [
            "ann@[127.0.0.1]",
            "ann@localhost",
            "ann@10.0.0.1",
            "ann@example.com.",
        ] {
            assert!(parse_address(bad).is_err(), "{bad:?}");
        }
        let long = format!("{}@example.com", "a".repeat(250));
        assert_eq!(parse_address(&long), Err(BadAddress::TooLong));
        let padded = format!(" {}@example.com", "a".repeat(242));
        assert_eq!(padded.len(), 255, "254 once trimmed");
        assert_eq!(parse_address(&padded), Err(BadAddress::TooLong));
    }
}
