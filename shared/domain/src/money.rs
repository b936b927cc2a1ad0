//! Amounts as a reader expects them: in the currency's own minor units (ISO 4217: JPY has none,
//! KWD three) and with the separators of the reader's language.
//!
//! Prices travel as integers of minor units (docs/design.md). How many digits follow the decimal
//! point is a property of the currency, not a constant: 1200 minor units of yen are 1,200 JPY,
//! of euros 12.00 EUR, of dinars 1.200 KWD. The table below is ISO 4217's list of currencies
//! whose minor unit is not 2 (all others, and codes it does not know, have 2).

/// ISO 4217 currencies with no minor unit.
const ZERO_DECIMALS: &[&str] = &[
    "BIF", "CLP", "DJF", "GNF", "ISK", "JPY", "KMF", "KRW", "PYG", "RWF", "UGX", "UYI", "VND",
    "VUV", "XAF", "XOF", "XPF",
];
/// ISO 4217 currencies with three decimals.
const THREE_DECIMALS: &[&str] = &["BHD", "IQD", "JOD", "KWD", "LYD", "OMR", "TND"];
/// ISO 4217 currencies with four decimals (units of account).
const FOUR_DECIMALS: &[&str] = &["CLF", "UYW"];

/// Digits after the decimal point in `currency` (an ISO 4217 code, any case): 2 unless listed.
pub fn minor_units(currency: &str) -> u32 {
    let code = currency.to_ascii_uppercase();
    let code = code.as_str();
    if ZERO_DECIMALS.contains(&code) {
        0
    } else if THREE_DECIMALS.contains(&code) {
        3
    } else if FOUR_DECIMALS.contains(&code) {
        4
    } else {
        2
    }
}

/// A decimal amount as a catalog writes it (`"12.99"`, `12.99`, `"1200"`) in minor units of
/// `currency`: 1299 EUR cents, 1200 yen. Digits past the currency's minor units must be zeros
/// (`12.990` EUR is 1299, `12.999` is refused): a price is never rounded.
pub fn parse_major(text: &str, currency: &str) -> Result<i64, BadAmount> {
    let bad = || BadAmount(text.to_owned());
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || !digits(whole)
        || !digits(fraction)
        || (text.contains('.') && fraction.is_empty())
    {
        return Err(bad());
    }
    let decimals = minor_units(currency) as usize;
    let (kept, rest) = fraction.split_at(fraction.len().min(decimals));
    if rest.bytes().any(|b| b != b'0') {
        return Err(bad());
    }
    let padded = format!("{whole}{kept:0<decimals$}");
    padded.parse::<i64>().map_err(|_| bad())
}

/// A price that is not a plain non-negative decimal in its currency's minor units.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an amount in the currency's minor units (digits, one '.', no rounding)")]
pub struct BadAmount(pub String);

/// How a language writes numbers: its decimal mark and the mark between groups of three.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Separators {
    pub decimal: char,
    pub group: char,
}

impl Separators {
    /// `1,234.56`: English, Japanese, Chinese, Korean and any language not listed below.
    pub const POINT: Separators = Separators {
        decimal: '.',
        group: ',',
    };

    /// The separators of BCP 47 language tag `locale` (`de-AT`, `fr`, `ja-JP`), by its language.
    pub fn of(locale: &str) -> Separators {
        let language = locale
            .split(['-', '_'])
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        match language.as_str() {
            // 1.234,56
            "de" | "es" | "it" | "nl" | "pt" | "da" | "id" | "tr" | "el" | "ro" | "hr" | "sl" => {
                Separators {
                    decimal: ',',
                    group: '.',
                }
            }
            // 1 234,56, with a narrow no-break space so the amount never wraps.
            "fr" | "sv" | "nb" | "no" | "fi" | "pl" | "cs" | "sk" | "ru" | "uk" | "hu" | "bg" => {
                Separators {
                    decimal: ',',
                    group: '\u{202f}',
                }
            }
            _ => Separators::POINT,
        }
    }
}

/// `minor` units of `currency` as `sep` writes them, followed by the code: `1,200 JPY`,
/// `12.00 EUR`, `1.234,56 EUR`. No code when `currency` is empty.
pub fn format(minor: i64, currency: &str, sep: Separators) -> String {
    let decimals = minor_units(currency);
    let scale = 10u64.pow(decimals);
    let m = minor.unsigned_abs();
    let mut out = String::new();
    if minor < 0 {
        out.push('-');
    }
    out.push_str(&grouped(m / scale, sep.group));
    if decimals > 0 {
        out.push(sep.decimal);
        out.push_str(&format!("{:0width$}", m % scale, width = decimals as usize));
    }
    if !currency.is_empty() {
        out.push(' ');
        out.push_str(currency);
    }
    out
}

/// `1234567` → `1,234,567` with `group` as the mark.
fn grouped(n: u64, group: char) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(group);
        }
        out.push(d);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn en(minor: i64, currency: &str) -> String {
        format(minor, currency, Separators::POINT)
    }

    #[test]
    fn each_currency_has_its_own_minor_units() {
        assert_eq!(en(1200, "JPY"), "1,200 JPY");
        assert_eq!(en(1200, "KRW"), "1,200 KRW");
        assert_eq!(en(1200, "EUR"), "12.00 EUR");
        assert_eq!(en(1200, "USD"), "12.00 USD");
        assert_eq!(en(1200, "KWD"), "1.200 KWD");
        assert_eq!(en(1200, "BHD"), "1.200 BHD");
        assert_eq!(en(12345, "CLF"), "1.2345 CLF");
        // An unknown code is taken to have two decimals, as most do.
        assert_eq!(en(1200, "XYZ"), "12.00 XYZ");
        assert_eq!(minor_units("jpy"), 0);
    }

    #[test]
    fn amounts_are_grouped_signed_and_padded() {
        assert_eq!(en(123456, "EUR"), "1,234.56 EUR");
        assert_eq!(en(123_456_789, "JPY"), "123,456,789 JPY");
        assert_eq!(en(5, ""), "0.05");
        assert_eq!(en(-150, "USD"), "-1.50 USD");
        assert_eq!(en(7, "KWD"), "0.007 KWD");
        assert_eq!(en(i64::MIN, "JPY"), "-9,223,372,036,854,775,808 JPY");
    }

    #[test]
    fn each_language_writes_its_own_separators() {
        for (currency, language, written) in [
            ("EUR", "de-AT", "1.234,56 EUR"),
            ("EUR", "fr", "1\u{202f}234,56 EUR"),
            ("JPY", "ja-JP", "123,456 JPY"),
            ("USD", "en_US", "1,234.56 USD"),
        ] {
            assert_eq!(
                format(123456, currency, Separators::of(language)),
                written,
                "{language}"
            );
        }
        assert_eq!(Separators::of(""), Separators::POINT);
    }

    #[test]
    fn catalog_amounts_become_minor_units_without_rounding() {
        assert_eq!(parse_major("12.99", "EUR"), Ok(1299));
        assert_eq!(parse_major("12.9", "EUR"), Ok(1290));
        assert_eq!(parse_major("12", "EUR"), Ok(1200));
        assert_eq!(parse_major("12.990", "EUR"), Ok(1299));
        assert_eq!(parse_major("1200", "JPY"), Ok(1200));
        assert_eq!(parse_major("1200.0", "JPY"), Ok(1200));
        assert_eq!(parse_major("1.2", "KWD"), Ok(1200));
        assert_eq!(parse_major("0.005", "BHD"), Ok(5));
        for bad in [
            "12.999",
            "1200.5",
            "",
            ".5",
            "12.",
            "-1",
            "1e3",
            "12,99",
            " 12",
            "99999999999999999999",
        ] {
            let currency = if bad == "1200.5" { "JPY" } else { "EUR" };
            assert!(parse_major(bad, currency).is_err(), "{bad} {currency}");
        }
    }

    proptest! {
        #[test]
        fn an_amount_reads_back_as_its_minor_units(
            minor in any::<i64>(), currency in prop::sample::select(vec!["JPY", "EUR", "KWD", "CLF"]),
            locale in prop::sample::select(vec!["en", "de", "fr", "ja"]),
        ) {
            let sep = Separators::of(locale);
            let text = format(minor, currency, sep);
            let number = text.strip_suffix(&format!(" {currency}")).unwrap();
            let digits: String = number
                .chars()
                .filter(|c| *c != sep.group && *c != sep.decimal)
                .collect();
            prop_assert_eq!(digits.parse::<i128>().unwrap(), i128::from(minor));
            let decimals = number.split(sep.decimal).nth(1).map_or(0, str::len);
            prop_assert_eq!(decimals as u32, minor_units(currency));
        }

        #[test]
        fn a_formatted_amount_parses_back(
            minor in 0..i64::MAX, currency in prop::sample::select(vec!["JPY", "EUR", "KWD", "CLF"]),
        ) {
            let text = format(minor, currency, Separators::POINT).replace(',', "");
            let number = text.strip_suffix(&format!(" {currency}")).unwrap();
            prop_assert_eq!(parse_major(number, currency), Ok(minor));
        }
    }
}
