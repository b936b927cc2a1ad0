//! Every sentence a person reads in a notification, in each language Tidings writes, in one place.
//!
//! A notification says one of a few things ([`Said`]); [`say`] writes it in the reader's
//! language, with amounts already formatted for them ([`crate::money`]). A language is added by
//! adding its arm to [`say`] and its tag to [`Lang::of`]; a test checks that every language has
//! every sentence.

/// A language notifications are written in. A device whose locale names another gets English.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lang {
    En,
    Ja,
}

impl Lang {
    pub const ALL: [Lang; 2] = [Lang::En, Lang::Ja];

    /// The language of BCP 47 tag `locale` (`ja-JP` → Japanese), English when not written.
    pub fn of(locale: &str) -> Lang {
        let language = locale.split(['-', '_']).next().unwrap_or_default();
        if language.eq_ignore_ascii_case("ja") {
            Lang::Ja
        } else {
            Lang::En
        }
    }
}

/// The longest locale a device may name (RFC 5646's recommended buffer).
pub const MAX_LOCALE_LEN: usize = 35;

/// A locale that is not a BCP 47 language tag of the shape Tidings takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "locale {0:?} is not a BCP 47 language tag (a 2- or 3-letter language and optional \
     `-`-separated subtags of 1 to 8 letters or digits, at most 35 characters, e.g. `ja-JP`)"
)]
pub struct InvalidLocale(pub String);

/// Checks that `locale` has the shape of a BCP 47 tag (`ja`, `ja-JP`, `zh-Hant-TW`): what the
/// browser's `navigator.language` gives. A language Tidings does not write reads English.
pub fn check_locale(locale: &str) -> Result<(), InvalidLocale> {
    let mut parts = locale.split('-');
    let language_ok = parts
        .next()
        .is_some_and(|l| (2..=3).contains(&l.len()) && l.bytes().all(|b| b.is_ascii_alphabetic()));
    let subtags_ok =
        parts.all(|p| (1..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric()));
    if language_ok && subtags_ok && locale.len() <= MAX_LOCALE_LEN {
        Ok(())
    } else {
        Err(InvalidLocale(locale.to_owned()))
    }
}

/// What a notification says, with its amounts written for the reader.
#[derive(Clone, Copy, Debug)]
pub enum Said<'a> {
    /// `price_below`: the item costs `price`, under the reader's `limit`.
    Below {
        item: &'a str,
        price: &'a str,
        limit: &'a str,
    },
    /// `price_drop`: the item fell at least `percent` % to `price`, from `was` where known.
    Dropped {
        item: &'a str,
        percent: u8,
        price: &'a str,
        was: Option<&'a str>,
    },
    /// `back_in_stock`: the item can be bought again, at `price`.
    Restocked { item: &'a str, price: &'a str },
    /// What a notification said stopped holding: the item was `was` at `at` (a local time), and
    /// is `now` something else.
    Changed {
        item: &'a str,
        was: &'a str,
        at: &'a str,
        now: Now<'a>,
    },
}

/// What an item is now, when a notification about it no longer holds.
#[derive(Clone, Copy, Debug)]
pub enum Now<'a> {
    /// On sale at this price.
    Price(&'a str),
    /// Out of stock.
    SoldOut,
    /// Not sold at all (the seller paused it, or it is gone).
    Unavailable,
}

/// `said` as a notification's title and body in `lang`.
pub fn say(lang: Lang, said: Said<'_>) -> (String, String) {
    match said {
        Said::Below { item, price, limit } => match lang {
            Lang::En => (
                format!("{item} is below your price"),
                format!("Now {price} (your limit: {limit})."),
            ),
            Lang::Ja => (
                format!("{item}が指定価格を下回りました"),
                format!("現在 {price}（指定価格: {limit}）"),
            ),
        },
        Said::Dropped {
            item,
            percent,
            price,
            was,
        } => match (lang, was) {
            (Lang::En, Some(was)) => (
                format!("{item} dropped at least {percent}%"),
                format!("Now {price}, down from {was}."),
            ),
            (Lang::En, None) => (
                format!("{item} dropped at least {percent}%"),
                format!("Now {price}."),
            ),
            (Lang::Ja, Some(was)) => (
                format!("{item}が{percent}%以上値下がりしました"),
                format!("現在 {price}（{was}から値下がり）"),
            ),
            (Lang::Ja, None) => (
                format!("{item}が{percent}%以上値下がりしました"),
                format!("現在 {price}"),
            ),
        },
        Said::Changed { item, was, at, now } => changed(lang, item, was, at, now),
        Said::Restocked { item, price } => match lang {
            Lang::En => (
                format!("{item} is back in stock"),
                format!("Available now at {price}."),
            ),
            Lang::Ja => (
                format!("{item}が再入荷しました"),
                format!("現在 {price}で購入できます"),
            ),
        },
    }
}

fn changed(lang: Lang, item: &str, was: &str, at: &str, now: Now<'_>) -> (String, String) {
    match lang {
        Lang::En => (
            format!("{item} has changed"),
            match now {
                Now::Price(now) => format!("Was {was} at {at}, now {now}."),
                Now::SoldOut => format!("Was {was} at {at}, now sold out."),
                Now::Unavailable => format!("Was {was} at {at}, now not on sale."),
            },
        ),
        Lang::Ja => (
            format!("{item}の状況が変わりました"),
            match now {
                Now::Price(now) => format!("{at}時点では{was}、現在 {now}"),
                Now::SoldOut => format!("{at}時点では{was}、現在 在庫切れ"),
                Now::Unavailable => format!("{at}時点では{was}、現在 販売停止中"),
            },
        ),
    }
}

/// What a mail says around a notification's words: a mail is read hours after it is sent and
/// cannot be recalled, so it says when its value was seen and until when it holds, links to the
/// value now, and says how to stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MailLines {
    /// After the title in the subject: when the value was seen.
    pub subject_as_of: String,
    /// When the value was seen, and until when the notification holds.
    pub validity: String,
    /// The link to the value now.
    pub check_now: &'static str,
    /// The link that stops the mails.
    pub unsubscribe: &'static str,
}

/// The mail's lines in `lang`, for a value seen at `as_of` that holds until `until` (local
/// times, `HH:MM`).
pub fn mail_lines(lang: Lang, as_of: &str, until: &str) -> MailLines {
    match lang {
        Lang::En => MailLines {
            subject_as_of: format!("(as of {as_of})"),
            validity: format!("As of {as_of}; this holds until {until}."),
            check_now: "See the price now",
            unsubscribe: "Stop these emails",
        },
        Lang::Ja => MailLines {
            subject_as_of: format!("（{as_of}時点）"),
            validity: format!("{as_of}時点の情報です。{until}まで有効です。"),
            check_now: "現在の価格を確認",
            unsubscribe: "メールの配信を停止",
        },
    }
}

/// The words of the pages a mail's links open (the api serves them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageLines {
    /// The notification still holds at the value checked at `at`.
    pub holds: String,
    /// It no longer does.
    pub ended: String,
    /// The page could not check now.
    pub unchecked: &'static str,
    pub confirm_title: &'static str,
    pub confirm_button: &'static str,
    pub confirmed: &'static str,
    pub link_used: &'static str,
    pub link_expired: &'static str,
    pub link_unknown: &'static str,
    pub unsubscribe_title: &'static str,
    pub unsubscribe_button: &'static str,
    pub unsubscribed: &'static str,
}

/// The confirmation mail's subject and text in `lang`: its link works once, until `until`.
pub fn confirmation_mail(lang: Lang, link: &str, until: &str) -> (&'static str, String) {
    match lang {
        Lang::En => (
            "Confirm your Tidings notifications",
            format!(
                "Someone, perhaps you, asked for price notifications at this address.\n\n\
                 To receive them, open this link (it works once, until {until}):\n{link}\n\n\
                 If it was not you, ignore this mail: nothing more will be sent.\n"
            ),
        ),
        Lang::Ja => (
            "Tidingsの通知の確認",
            format!(
                "このアドレスへの価格通知が申し込まれました。\n\n\
                 受け取るには次のリンクを開いてください（{until}まで、一度だけ有効）：\n{link}\n\n\
                 お心当たりがなければ、このメールは無視してください。これ以上は送られません。\n"
            ),
        ),
    }
}

/// The pages' words in `lang`, for a check made at `at` (a local time, `HH:MM`).
pub fn page_lines(lang: Lang, at: &str) -> PageLines {
    match lang {
        Lang::En => PageLines {
            holds: format!("Still true at {at}."),
            ended: format!("This has ended: checked at {at}."),
            unchecked: "The shop did not answer just now; try again in a minute.",
            confirm_title: "Confirm your email address",
            confirm_button: "Yes, send my notifications to this address",
            confirmed: "Confirmed: your notifications will come to this address.",
            link_used: "This link was used already: your address is confirmed.",
            link_expired: "This link has expired. Ask for notifications again to get a new one.",
            link_unknown: "This link is not valid (or its address was unsubscribed).",
            unsubscribe_title: "Stop these emails",
            unsubscribe_button: "Stop all emails to this address",
            unsubscribed: "Done: no more emails will be sent to this address.",
        },
        Lang::Ja => PageLines {
            holds: format!("{at}時点でも有効です。"),
            ended: format!("終了しました（{at}に確認）。"),
            unchecked: "ショップが応答しませんでした。しばらくしてからもう一度お試しください。",
            confirm_title: "メールアドレスの確認",
            confirm_button: "このアドレスに通知を送る",
            confirmed: "確認しました。通知はこのアドレスに届きます。",
            link_used: "このリンクは使用済みです。アドレスは確認済みです。",
            link_expired: "このリンクの有効期限が切れています。もう一度通知を申し込んでください。",
            link_unknown: "このリンクは無効です（または配信停止済みです）。",
            unsubscribe_title: "メールの配信停止",
            unsubscribe_button: "このアドレスへのメールをすべて停止",
            unsubscribed: "停止しました。このアドレスにはもうメールは届きません。",
        },
    }
}

/// One member of a digest: an item and its value at the digest's re-check, written for the
/// reader.
#[derive(Clone, Copy, Debug)]
pub struct DigestEntry<'a> {
    pub item: &'a str,
    pub price: &'a str,
}

/// A digest's title and body in `lang`: "3 of your watches" and each member's item with its
/// value now, in order, for as many as fit in `budget` bytes of body; the rest are counted
/// ("and 2 more"), never cut mid-entry. At least one entry is written whatever its length.
pub fn digest(lang: Lang, entries: &[DigestEntry<'_>], budget: usize) -> (String, String) {
    let n = entries.len();
    let title = match lang {
        Lang::En if n == 1 => "1 of your watches".to_owned(),
        Lang::En => format!("{n} of your watches"),
        Lang::Ja => format!("ウォッチ中の{n}件"),
    };
    let (separator, end) = match lang {
        Lang::En => (", ", "."),
        Lang::Ja => ("、", ""),
    };
    let mut body = String::new();
    let mut written = 0;
    for e in entries {
        let entry = match lang {
            Lang::En => format!("{} now {}", e.item, e.price),
            Lang::Ja => format!("{} 現在 {}", e.item, e.price),
        };
        let sep = if written == 0 { "" } else { separator };
        if written > 0 && body.len() + sep.len() + entry.len() > budget {
            break;
        }
        body.push_str(sep);
        body.push_str(&entry);
        written += 1;
    }
    let more = n - written;
    if more > 0 {
        body.push_str(&match lang {
            Lang::En => format!(", and {more} more"),
            Lang::Ja => format!("、ほか{more}件"),
        });
    }
    body.push_str(end);
    (title, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_sentence() -> [Said<'static>; 7] {
        let changed = |now| Said::Changed {
            item: "SKU-1",
            was: "999 JPY",
            at: "10:02",
            now,
        };
        [
            changed(Now::Price("1,500 JPY")),
            changed(Now::SoldOut),
            changed(Now::Unavailable),
            Said::Below {
                item: "SKU-1",
                price: "1,100 JPY",
                limit: "1,200 JPY",
            },
            Said::Dropped {
                item: "SKU-1",
                percent: 10,
                price: "900 JPY",
                was: Some("1,000 JPY"),
            },
            Said::Dropped {
                item: "SKU-1",
                percent: 10,
                price: "900 JPY",
                was: None,
            },
            Said::Restocked {
                item: "SKU-1",
                price: "900 JPY",
            },
        ]
    }

    #[test]
    fn every_language_says_every_sentence_with_its_amounts() {
        for lang in Lang::ALL {
            for said in every_sentence() {
                let (title, body) = say(lang, said);
                assert!(title.contains("SKU-1"), "{lang:?} {said:?}: {title}");
                assert!(body.contains("JPY"), "{lang:?} {said:?}: {body}");
                if let Said::Dropped { was: Some(was), .. } = said {
                    assert!(body.contains(was), "{lang:?}: {body}");
                }
            }
        }
    }

    #[test]
    fn japanese_reads_as_japanese() {
        let (title, body) = say(Lang::Ja, every_sentence()[3]);
        assert_eq!(title, "SKU-1が指定価格を下回りました");
        assert_eq!(body, "現在 1,100 JPY（指定価格: 1,200 JPY）");
        let (title, body) = say(Lang::En, every_sentence()[3]);
        assert_eq!(title, "SKU-1 is below your price");
        assert_eq!(body, "Now 1,100 JPY (your limit: 1,200 JPY).");
        let (_, body) = say(Lang::En, every_sentence()[0]);
        assert_eq!(body, "Was 999 JPY at 10:02, now 1,500 JPY.");
        let (_, body) = say(Lang::Ja, every_sentence()[0]);
        assert_eq!(body, "10:02時点では999 JPY、現在 1,500 JPY");
    }

    #[test]
    fn a_locale_has_the_shape_of_a_language_tag() {
        for good in ["ja", "ja-JP", "en-GB", "zh-Hant-TW", "es-419", "de-CH-1996"] {
            assert_eq!(check_locale(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "j",
            "japanese",
            "ja_JP",
            "ja-",
            "-JP",
            "ja--JP",
            "ja-JP-toolongsubtag",
            "日本",
            "ja JP",
            "en-\u{0}",
        ] {
            assert!(check_locale(bad).is_err(), "{bad:?}");
        }
        assert!(check_locale(&format!("en{}", "-abcdefgh".repeat(4))).is_err());
    }

    #[test]
    fn a_locale_picks_its_language_or_english() {
        assert_eq!(Lang::of("ja"), Lang::Ja);
        assert_eq!(Lang::of("ja-JP"), Lang::Ja);
        assert_eq!(Lang::of("JA_jp"), Lang::Ja);
        for other in ["en-GB", "de", "", "jav", "x"] {
            assert_eq!(Lang::of(other), Lang::En, "{other}");
        }
    }

    #[test]
    fn every_language_writes_a_mails_lines_with_both_times() {
        for lang in Lang::ALL {
            let lines = mail_lines(lang, "09:00", "09:20");
            assert!(lines.subject_as_of.contains("09:00"), "{lang:?}");
            assert!(
                lines.validity.contains("09:00") && lines.validity.contains("09:20"),
                "{lang:?}: {}",
                lines.validity
            );
            assert!(!lines.check_now.is_empty() && !lines.unsubscribe.is_empty());
        }
    }

    fn entries(n: usize) -> Vec<(String, String)> {
        (0..n)
            .map(|i| (format!("SKU-{i}"), format!("{}.99 EUR", 9 + i)))
            .collect()
    }

    fn as_entries(v: &[(String, String)]) -> Vec<DigestEntry<'_>> {
        v.iter()
            .map(|(item, price)| DigestEntry { item, price })
            .collect()
    }

    #[test]
    fn a_digest_lists_its_members_in_the_readers_language() {
        let three = entries(3);
        let (title, body) = digest(Lang::En, &as_entries(&three), 500);
        assert_eq!(title, "3 of your watches");
        assert_eq!(
            body,
            "SKU-0 now 9.99 EUR, SKU-1 now 10.99 EUR, SKU-2 now 11.99 EUR."
        );
        let (title, body) = digest(Lang::Ja, &as_entries(&three[..1]), 500);
        assert_eq!(title, "ウォッチ中の1件");
        assert_eq!(body, "SKU-0 現在 9.99 EUR");
        assert_eq!(
            digest(Lang::En, &as_entries(&three[..1]), 500).0,
            "1 of your watches"
        );
    }

    #[test]
    fn a_long_digest_counts_what_does_not_fit_and_cuts_no_entry() {
        let many = entries(40);
        let (_, body) = digest(Lang::En, &as_entries(&many), 100);
        assert!(body.ends_with(" more."), "{body}");
        let listed = body.matches(" now ").count();
        assert!(
            body.ends_with(&format!(", and {} more.", 40 - listed)),
            "{body}"
        );
        assert!(body.len() <= 100 + ", and 40 more.".len(), "{}", body.len());
        // One entry longer than the whole budget is still written.
        let long = [("x".repeat(300), "1.00 EUR".to_owned())];
        let (_, body) = digest(Lang::En, &as_entries(&long), 100);
        assert!(body.starts_with("xxx") && body.ends_with("now 1.00 EUR."));
    }
}
