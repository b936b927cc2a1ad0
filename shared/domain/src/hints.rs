//! Change hints: "these items changed", pushed in by whoever owns the data (over the api's
//! `POST /v1/items/changed`, or on NATS inside the cluster). A hint is never trusted for a value:
//! it only makes the detector fetch those items now instead of at its next scan.

use crate::item::{InvalidItemCode, ItemCode};
use serde::{Deserialize, Serialize};

/// Items one hint may name.
pub const MAX_ITEMS: usize = 1000;

/// A hint's body: item codes as their source knows them (without the source's prefix).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemsChanged {
    pub items: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum BadHint {
    #[error("not a hint ({{\"items\": [\"<code>\", …]}}): {0}")]
    Json(#[source] serde_json::Error),
    #[error("a hint names 1 to {MAX_ITEMS} items, this one {0}")]
    Count(usize),
    #[error("item {index}")]
    Code {
        index: usize,
        #[source]
        source: InvalidItemCode,
    },
}

/// The item codes a hint names, each checked.
pub fn decode(bytes: &[u8]) -> Result<Vec<ItemCode>, BadHint> {
    let hint: ItemsChanged = serde_json::from_slice(bytes).map_err(BadHint::Json)?;
    if hint.items.is_empty() || hint.items.len() > MAX_ITEMS {
        return Err(BadHint::Count(hint.items.len()));
    }
    hint.items
        .iter()
        .enumerate()
        .map(|(index, c)| ItemCode::parse(c).map_err(|source| BadHint::Code { index, source }))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_hint_names_valid_codes_and_not_too_many() {
        let codes = decode(br#"{"items": ["4711", "tee::sku:A"]}"#).unwrap();
        assert_eq!(codes.len(), 2);
        for bad in [
            r#"{"items": []}"#,
            r#"{"items": ["a/b"]}"#,
            r#"{"items": ["a"], "extra": 1}"#,
            r#"["a"]"#,
        ] {
            assert!(decode(bad.as_bytes()).is_err(), "{bad}");
        }
        let many = serde_json::json!({"items": vec!["a"; MAX_ITEMS + 1]}).to_string();
        assert!(matches!(decode(many.as_bytes()), Err(BadHint::Count(1001))));
    }

    proptest! {
        #[test]
        fn no_body_makes_decoding_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&body);
        }
    }
}
