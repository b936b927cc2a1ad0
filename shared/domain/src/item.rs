//! Item codes: what a watch watches, and what a source is asked about.

use serde::{Deserialize, Serialize};
use std::fmt;

/// An item code: 1 to 128 characters from `A-Z a-z 0-9 . _ - :`, not only dots. Restricting the
/// alphabet keeps codes safe in URLs, subjects, logs and metrics without escaping surprises;
/// `.` and `..` would be path segments that move a source request to another path.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ItemCode(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid item code {0:?}: use 1 to 128 characters from A-Z, a-z, 0-9, '.', '_', '-', ':', not only dots"
)]
pub struct InvalidItemCode(pub String);

impl ItemCode {
    pub const MAX_LEN: usize = 128;

    pub fn parse(s: &str) -> Result<Self, InvalidItemCode> {
        let ok = !s.is_empty()
            && s.len() <= Self::MAX_LEN
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
            && !s.bytes().all(|b| b == b'.');
        if ok {
            Ok(ItemCode(s.to_owned()))
        } else {
            Err(InvalidItemCode(s.to_owned()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ItemCode {
    type Error = InvalidItemCode;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        ItemCode::parse(&s)
    }
}

impl From<ItemCode> for String {
    fn from(c: ItemCode) -> String {
        c.0
    }
}

impl fmt::Display for ItemCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_url_safe_codes_only() {
        assert!(ItemCode::parse("SKU-12_3.a:b").is_ok());
        assert!(ItemCode::parse(".a").is_ok() && ItemCode::parse("a..b").is_ok());
        for bad in [
            "",
            "a b",
            "a/b",
            "a?b",
            "ä",
            ".",
            "..",
            "...",
            &"x".repeat(129),
        ] {
            assert!(ItemCode::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(serde_json::from_str::<ItemCode>("\"a/b\"").is_err());
    }
}
