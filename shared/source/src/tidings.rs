//! The `tidings` format, Tidings' own protocol (what an adapter in front of a catalog serves):
//!
//! - one item: `GET <item_url with {item} replaced>` → `200 {"price": 1100, "currency": "EUR",
//!   "in_stock": true, "paused": false}`. `"price": null` means the item has nothing to sell
//!   (`empty`).
//! - many items (optional): `GET <batch_url with {items} replaced by comma-separated codes>` →
//!   `200 {"items": {"<code>": <item body> | {"error": "<kind>"} | null}}`; a code that is missing
//!   or null is `not_found`. A failed batch request fails each of its items the same way.

use crate::client::{Body, Get, Source, unasked_304};
use crate::{Fetched, SourceError};
use chrono::Utc;
use serde::Deserialize;
use std::collections::HashMap;
use tidings_domain::item::ItemCode;
use tidings_domain::trigger::{Observation, SourceErrorKind};

/// A batch answer's cap: a hundred items of a few hundred bytes each, with room to spare.
const MAX_BATCH_BODY: usize = 16 * 1024 * 1024;

#[derive(Deserialize)]
struct ItemBody {
    price: Option<i64>,
    #[serde(default)]
    currency: String,
    in_stock: bool,
    #[serde(default)]
    paused: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum BatchEntry {
    Error { error: SourceErrorKind },
    Item(ItemBody),
}

#[derive(Deserialize)]
struct BatchBody {
    items: HashMap<String, Option<BatchEntry>>,
}

impl ItemBody {
    fn into_observation(self) -> Fetched {
        match self.price {
            None => Err(SourceError::new(
                SourceErrorKind::Empty,
                "no price: nothing to sell",
            )),
            Some(p) if p < 0 => Err(SourceError::new(
                SourceErrorKind::BadData,
                format!("negative price {p}"),
            )),
            Some(price) => Ok(Observation {
                price,
                currency: self.currency,
                in_stock: self.in_stock,
                paused: self.paused,
                observed_at: Utc::now(),
                stock_stated: true,
            }),
        }
    }
}

/// One item's answer.
pub(crate) fn read_item(body: &[u8]) -> Fetched {
    serde_json::from_slice::<ItemBody>(body)
        .map_err(|e| SourceError::new(SourceErrorKind::BadData, e.to_string()))?
        .into_observation()
}

/// One batch request for `codes` (item, code without the source's prefix).
pub(crate) async fn fetch_batch(
    source: &Source,
    template: &str,
    codes: &[(ItemCode, String)],
) -> Vec<(ItemCode, Fetched)> {
    let joined: Vec<&str> = codes.iter().map(|(_, c)| c.as_str()).collect();
    let url = template.replace("{items}", &joined.join(","));
    let limit = source.batch_limit.as_deref().unwrap_or(&source.item_limit);
    let get = Get {
        url: &url,
        limit,
        cap: MAX_BATCH_BODY,
        validators: None,
    };
    let parsed = match source.get(get).await {
        Ok(Body::Fresh(body, _)) => serde_json::from_slice::<BatchBody>(&body).map_err(|e| {
            SourceError::new(
                SourceErrorKind::BadData,
                format!("batch of {}: {e}", codes.len()),
            )
        }),
        Ok(Body::NotModified) => Err(unasked_304(format!("batch of {}", codes.len()))),
        Err(e) => Err(e),
    };
    match parsed {
        Err(e) => codes
            .iter()
            .map(|(item, _)| (item.clone(), Err(e.clone())))
            .collect(),
        Ok(mut batch) => codes
            .iter()
            .map(|(item, code)| {
                let answer = match batch.items.remove(code.as_str()).flatten() {
                    None => Err(SourceError::new(
                        SourceErrorKind::NotFound,
                        "not in batch answer",
                    )),
                    Some(BatchEntry::Error { error }) => {
                        Err(SourceError::new(error, "reported by the batch endpoint"))
                    }
                    Some(BatchEntry::Item(body)) => body.into_observation(),
                };
                (item.clone(), answer)
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_bodies_classify() {
        let ok = read_item(br#"{"price": 1100, "currency": "EUR", "in_stock": true}"#).unwrap();
        assert_eq!((ok.price, ok.in_stock, ok.paused), (1100, true, false));
        let kind = |body: &str| read_item(body.as_bytes()).unwrap_err().kind;
        assert_eq!(
            kind(r#"{"price": null, "in_stock": false}"#),
            SourceErrorKind::Empty
        );
        assert_eq!(
            kind(r#"{"price": -1, "in_stock": true}"#),
            SourceErrorKind::BadData
        );
        assert_eq!(kind(r#"{"price": 1}"#), SourceErrorKind::BadData);
    }
}
