//! A notification as a mail reads it: the push's words from the same templates (language, time
//! zone, money), and what only a mail needs ([`crate::texts::mail_lines`]): "as of" and "holds
//! until" in the reader's time, the link to the value now, and the way out. Pure; the dispatcher
//! renders, `tidings-email` formats and signs.

use crate::messages::Payload;
use crate::notification::{Notice, render as push};
use crate::shown::local_time;
use crate::texts::{Lang, MailLines, mail_lines};
use chrono_tz::Tz;

/// Where a mail's links go.
#[derive(Clone, Copy, Debug)]
pub struct Links<'a> {
    /// The page that checks the item when it is opened (`/n/{id}?t=…`).
    pub check: &'a str,
    /// The one-click unsubscribe link.
    pub unsubscribe: &'a str,
}

/// A mail's subject and its two bodies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MailText {
    pub subject: String,
    pub text: String,
    pub html: String,
}

/// The mail for `n`, its times in `tz`.
pub fn render(n: &Notice<'_>, tz: Tz, links: &Links<'_>) -> MailText {
    let payload = push(n);
    let lang = Lang::of(n.locale.unwrap_or_default());
    let as_of = local_time(n.now.observed_at, tz);
    let until = local_time(n.valid_until, tz);
    let item = payload.url.as_deref().map(|url| (url, n.item.as_str()));
    compose(
        lang,
        &payload,
        &mail_lines(lang, &as_of, &until),
        links,
        item,
    )
}

/// A mail of `p`'s title and body: the subject says "as of", the body adds until when it holds,
/// the link that checks it now, the item's page (`item`: its URL and name) and the way out.
pub fn compose(
    lang: Lang,
    p: &Payload,
    lines: &MailLines,
    links: &Links<'_>,
    item: Option<(&str, &str)>,
) -> MailText {
    let subject = match lang {
        Lang::En => format!("{} {}", p.title, lines.subject_as_of),
        Lang::Ja => format!("{}{}", p.title, lines.subject_as_of),
    };
    let mut text = format!(
        "{}\n\n{}\n\n{}: {}\n",
        p.body, lines.validity, lines.check_now, links.check
    );
    if let Some((url, _)) = item {
        text.push_str(url);
        text.push('\n');
    }
    text.push_str(&format!("\n{}: {}\n", lines.unsubscribe, links.unsubscribe));
    let item = item.map_or(String::new(), |(url, name)| {
        format!("<p><a href=\"{}\">{}</a></p>", escape(url), escape(name))
    });
    let html = format!(
        "<!doctype html><html lang=\"{lang}\"><head><meta charset=\"utf-8\"><title>{title}</title></head>\
         <body><h1>{title}</h1><p>{body}</p><p>{validity}</p>\
         <p><a href=\"{check}\">{check_now}</a></p>{item}\
         <p><small><a href=\"{unsubscribe}\">{stop}</a></small></p></body></html>",
        lang = match lang {
            Lang::En => "en",
            Lang::Ja => "ja",
        },
        title = escape(&p.title),
        body = escape(&p.body),
        validity = escape(&lines.validity),
        check = escape(links.check),
        check_now = escape(lines.check_now),
        unsubscribe = escape(links.unsubscribe),
        stop = escape(lines.unsubscribe),
    );
    MailText {
        subject,
        text,
        html,
    }
}

/// `s` as HTML text or an attribute value: nothing in it can open a tag or end an attribute.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::ItemCode;
    use crate::trigger::{Baseline, Observation, Trigger};
    use crate::{OutboxId, WatchId};
    use chrono::{TimeZone, Utc};

    const LINKS: Links<'static> = Links {
        check: "https://tidings.test/n/1?t=abc",
        unsubscribe: "https://tidings.test/u/1?t=def",
    };

    fn mail(locale: Option<&str>, currency: &str, tz: Tz, links: &Links<'_>) -> MailText {
        let item = ItemCode::parse("SKU-1").unwrap();
        let seen = Utc.with_ymd_and_hms(2026, 12, 5, 0, 2, 0).unwrap();
        let now = Observation::on_sale(999, currency, seen);
        render(
            &Notice {
                id: OutboxId::new(),
                watch: WatchId::new(),
                trigger: &Trigger::PriceBelow { threshold: 1200 },
                item: &item,
                now: &now,
                baseline: &Baseline::default(),
                valid_until: seen + chrono::Duration::minutes(20),
                item_url: Some("https://shop.test/i/{item}?a=1&b=2"),
                locale,
            },
            tz,
            links,
        )
    }

    #[test]
    fn a_mail_says_the_value_as_of_when_and_until_when_in_the_readers_time() {
        let m = mail(None, "EUR", chrono_tz::Europe::Berlin, &LINKS);
        assert_eq!(m.subject, "SKU-1 is below your price (as of 01:02)");
        assert_eq!(
            m.text,
            "Now 9.99 EUR (your limit: 12.00 EUR).\n\nAs of 01:02; this holds until 01:22.\n\n\
             See the price now: https://tidings.test/n/1?t=abc\n\
             https://shop.test/i/SKU-1?a=1&b=2\n\n\
             Stop these emails: https://tidings.test/u/1?t=def\n"
        );
        assert!(
            m.html
                .contains("<p>As of 01:02; this holds until 01:22.</p>"),
            "{}",
            m.html
        );
        assert!(
            m.html
                .contains("href=\"https://shop.test/i/SKU-1?a=1&amp;b=2\"")
        );

        let m = mail(Some("ja-JP"), "JPY", chrono_tz::Asia::Tokyo, &LINKS);
        assert_eq!(m.subject, "SKU-1が指定価格を下回りました（09:02時点）");
        assert!(
            m.text.starts_with("現在 999 JPY（指定価格: 1,200 JPY）"),
            "{}",
            m.text
        );
        assert!(m.text.contains("09:02時点の情報です。09:22まで有効です。"));
        assert!(m.html.starts_with("<!doctype html><html lang=\"ja\">"));
    }

    #[test]
    fn nothing_in_a_link_opens_a_tag_or_ends_an_attribute() {
        let hostile = Links {
            check: "https://t.test/\"><script>alert(1)</script>",
            unsubscribe: "https://t.test/'onmouseover='x",
        };
        let m = mail(None, "EUR", chrono_tz::UTC, &hostile);
        assert!(!m.html.contains("<script>"), "{}", m.html);
        assert!(m.html.contains("&quot;&gt;&lt;script&gt;"));
        assert!(m.html.contains("&#39;onmouseover=&#39;x"));
        assert_eq!(escape("a&<>\"'b"), "a&amp;&lt;&gt;&quot;&#39;b");
    }
}
