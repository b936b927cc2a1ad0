//! The `json` format: any JSON document, read by JSON Pointer (RFC 6901) paths, so a shop's
//! existing API needs no adapter.

use crate::{Fetched, SourceError};
use chrono::Utc;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use tidings_domain::money;
use tidings_domain::trigger::{Observation, SourceErrorKind};

/// Where a document keeps an item's price, currency, availability and pause.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonMapping {
    /// Pointer to the price: a number or a string; `null` means nothing to sell (`empty`).
    pub price: String,
    /// How the price is written: `major` (`12.99`, `"12.99"`) or `minor` (`1299`).
    #[serde(default)]
    pub price_in: PriceUnit,
    /// Pointer to the ISO 4217 currency code.
    pub currency: Option<String>,
    /// The currency of every item, when the document does not say.
    pub fixed_currency: Option<String>,
    /// Pointer to the availability: a boolean, or a value that `available` maps. Unset: always
    /// in stock.
    pub availability: Option<String>,
    /// Availability value (as text: `"in_stock"`, `"1"`) → in stock or not.
    #[serde(default)]
    pub available: BTreeMap<String, bool>,
    /// Pointer to a boolean that pauses the item's alerts; missing or `null` is not paused.
    pub paused: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PriceUnit {
    #[default]
    Major,
    Minor,
}

/// A mapping that cannot read any document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    #[error("{0}: {1:?} is not a JSON Pointer (RFC 6901: empty, or starting with '/')")]
    Pointer(&'static str, String),
    #[error("give exactly one of currency (a pointer) and fixed_currency (a code)")]
    Currency,
    #[error("fixed_currency {0:?} is not an ISO 4217 code (three letters A-Z)")]
    CurrencyCode(String),
    #[error("available maps values of availability: set availability, or leave available out")]
    AvailableWithoutAvailability,
}

fn pointer_ok(p: &str) -> bool {
    // `~` escapes only `~0` and `~1` (RFC 6901 §3).
    (p.is_empty() || p.starts_with('/'))
        && p.split('~')
            .skip(1)
            .all(|rest| rest.starts_with(['0', '1']))
}

fn currency_code_ok(c: &str) -> bool {
    c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase())
}

impl JsonMapping {
    /// Refuses a mapping that could not read any document, when it is loaded.
    pub fn check(&self) -> Result<(), MappingError> {
        let pointers = [
            ("price", Some(&self.price)),
            ("currency", self.currency.as_ref()),
            ("availability", self.availability.as_ref()),
            ("paused", self.paused.as_ref()),
        ];
        for (field, pointer) in pointers {
            if let Some(p) = pointer.filter(|p| !pointer_ok(p)) {
                return Err(MappingError::Pointer(field, p.clone()));
            }
        }
        match (&self.currency, &self.fixed_currency) {
            (Some(_), None) => {}
            (None, Some(code)) if currency_code_ok(code) => {}
            (None, Some(code)) => return Err(MappingError::CurrencyCode(code.clone())),
            _ => return Err(MappingError::Currency),
        }
        if self.availability.is_none() && !self.available.is_empty() {
            return Err(MappingError::AvailableWithoutAvailability);
        }
        Ok(())
    }

    /// The observation in `body`, or why there is none.
    pub fn read(&self, body: &[u8]) -> Fetched {
        let bad = |detail: String| SourceError::new(SourceErrorKind::BadData, detail);
        let doc: Value = serde_json::from_slice(body).map_err(|e| bad(format!("not JSON: {e}")))?;
        let at = |field: &str, pointer: &str| {
            doc.pointer(pointer)
                .ok_or_else(|| bad(format!("{field}: nothing at {pointer:?}")))
        };
        let currency = match (&self.currency, &self.fixed_currency) {
            (Some(p), _) => match at("currency", p)? {
                Value::String(c) if currency_code_ok(&c.to_ascii_uppercase()) => {
                    c.to_ascii_uppercase()
                }
                other => return Err(bad(format!("currency at {p:?} is {other}, not a code"))),
            },
            (None, Some(code)) => code.clone(),
            (None, None) => return Err(bad("no currency mapped".into())),
        };
        let price = match at("price", &self.price)? {
            Value::Null => {
                return Err(SourceError::new(
                    SourceErrorKind::Empty,
                    "no price: nothing to sell",
                ));
            }
            Value::Number(n) => self.amount(&n.to_string(), &currency),
            Value::String(s) => self.amount(s.trim(), &currency),
            other => Err(format!("is {other}")),
        }
        .map_err(|why| bad(format!("price at {:?} {why}", self.price)))?;
        let in_stock = match &self.availability {
            None => true,
            Some(p) => match at("availability", p)? {
                Value::Bool(b) => *b,
                Value::String(s) => self.available_as(s)?,
                Value::Number(n) => self.available_as(&n.to_string())?,
                other => return Err(bad(format!("availability at {p:?} is {other}"))),
            },
        };
        let paused = match self.paused.as_deref().map(|p| doc.pointer(p)) {
            None | Some(None) | Some(Some(Value::Null)) => false,
            Some(Some(Value::Bool(b))) => *b,
            Some(Some(other)) => return Err(bad(format!("paused is {other}, not a boolean"))),
        };
        Ok(Observation {
            price,
            currency,
            in_stock,
            paused,
            observed_at: Utc::now(),
            // Unmapped, availability is the operator's word that every item is in stock.
            stock_stated: self.availability.is_some(),
        })
    }

    fn amount(&self, text: &str, currency: &str) -> Result<i64, String> {
        match self.price_in {
            PriceUnit::Major => money::parse_major(text, currency).map_err(|e| e.to_string()),
            PriceUnit::Minor => text
                .parse::<i64>()
                .ok()
                .filter(|p| *p >= 0)
                .ok_or_else(|| format!("{text:?} is not a whole number of minor units")),
        }
    }

    fn available_as(&self, value: &str) -> Result<bool, SourceError> {
        self.available.get(value).copied().ok_or_else(|| {
            SourceError::new(
                SourceErrorKind::BadData,
                format!("availability {value:?} is not in the source's available map"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mapping(json: &str) -> JsonMapping {
        let m: JsonMapping = serde_json::from_str(json).unwrap();
        m.check().unwrap();
        m
    }

    fn shop() -> JsonMapping {
        mapping(
            r#"{"price": "/offer/amount", "currency": "/offer/currency",
                "availability": "/offer/stock", "available": {"in_stock": true, "few_left": true, "sold_out": false},
                "paused": "/hidden"}"#,
        )
    }

    #[test]
    fn a_mapped_document_becomes_an_observation() {
        let o = shop()
            .read(br#"{"offer": {"amount": "12.99", "currency": "eur", "stock": "few_left"}}"#)
            .unwrap();
        assert_eq!(
            (o.price, o.currency.as_str(), o.in_stock, o.paused),
            (1299, "EUR", true, false)
        );
        let o = shop()
            .read(br#"{"offer": {"amount": 1200, "currency": "JPY", "stock": "sold_out"}, "hidden": true}"#)
            .unwrap();
        assert_eq!((o.price, o.in_stock, o.paused), (1200, false, true));
        let minor = mapping(
            r#"{"price": "/p", "price_in": "minor", "fixed_currency": "EUR", "availability": "/a"}"#,
        );
        let o = minor.read(br#"{"p": 1299, "a": false}"#).unwrap();
        assert_eq!(
            (o.price, o.currency.as_str(), o.in_stock),
            (1299, "EUR", false)
        );
        // RFC 6901 escapes: `~1` is '/', `~0` is '~'.
        let escaped = mapping(r#"{"price": "/a~1b/m~0n", "fixed_currency": "USD"}"#);
        assert_eq!(escaped.read(br#"{"a/b": {"m~n": 5}}"#).unwrap().price, 500);
    }

    #[test]
    fn what_a_mapping_cannot_read_is_bad_data_that_says_why() {
        let kind_and_detail = |body: &str| {
            let e = shop().read(body.as_bytes()).unwrap_err();
            (e.kind, e.detail)
        };
        let cases = [
            (
                r#"{"offer": {"amount": null, "currency": "EUR", "stock": "in_stock"}}"#,
                SourceErrorKind::Empty,
                "nothing to sell",
            ),
            (
                r#"{"offer": {"currency": "EUR", "stock": "in_stock"}}"#,
                SourceErrorKind::BadData,
                "nothing at \"/offer/amount\"",
            ),
            (
                r#"{"offer": {"amount": "12.999", "currency": "EUR", "stock": "in_stock"}}"#,
                SourceErrorKind::BadData,
                "12.999",
            ),
            (
                r#"{"offer": {"amount": -1, "currency": "EUR", "stock": "in_stock"}}"#,
                SourceErrorKind::BadData,
                "-1",
            ),
            (
                r#"{"offer": {"amount": 1, "currency": "EURO", "stock": "in_stock"}}"#,
                SourceErrorKind::BadData,
                "not a code",
            ),
            (
                r#"{"offer": {"amount": 1, "currency": "EUR", "stock": "maybe"}}"#,
                SourceErrorKind::BadData,
                "\"maybe\"",
            ),
            (
                r#"{"offer": {"amount": 1, "currency": "EUR", "stock": "in_stock"}, "hidden": "yes"}"#,
                SourceErrorKind::BadData,
                "not a boolean",
            ),
            ("<html>", SourceErrorKind::BadData, "not JSON"),
        ];
        for (body, kind, says) in cases {
            let (k, detail) = kind_and_detail(body);
            assert_eq!(k, kind, "{body}");
            assert!(detail.contains(says), "{body}: {detail}");
        }
    }

    #[test]
    fn a_mapping_that_could_read_nothing_is_refused_when_loaded() {
        let check = |json: &str| serde_json::from_str::<JsonMapping>(json).unwrap().check();
        assert_eq!(
            check(r#"{"price": "offer.price", "fixed_currency": "EUR"}"#),
            Err(MappingError::Pointer("price", "offer.price".into()))
        );
        assert_eq!(
            check(r#"{"price": "/p", "fixed_currency": "EUR", "paused": "/a~2"}"#),
            Err(MappingError::Pointer("paused", "/a~2".into()))
        );
        assert_eq!(check(r#"{"price": "/p"}"#), Err(MappingError::Currency));
        assert_eq!(
            check(r#"{"price": "/p", "currency": "/c", "fixed_currency": "EUR"}"#),
            Err(MappingError::Currency)
        );
        assert_eq!(
            check(r#"{"price": "/p", "fixed_currency": "eur"}"#),
            Err(MappingError::CurrencyCode("eur".into()))
        );
        assert_eq!(
            check(r#"{"price": "/p", "fixed_currency": "EUR", "available": {"x": true}}"#),
            Err(MappingError::AvailableWithoutAvailability)
        );
        assert!(serde_json::from_str::<JsonMapping>(r#"{"price": "/p", "prise": "/q"}"#).is_err());
    }

    /// Any JSON document, nested up to serde_json's limit.
    fn document() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| serde_json::json!(f)),
            prop::sample::select(vec![
                "12.99", "eur", "in_stock", "sold_out", "1e400", "-0", ""
            ])
            .prop_map(Value::from),
            ".{0,12}".prop_map(Value::from),
        ];
        let key = prop::sample::select(vec!["offer", "amount", "currency", "stock", "hidden", "x"]);
        leaf.prop_recursive(6, 96, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(key.clone(), inner, 0..6).prop_map(|m| Value::Object(
                    m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
                )),
            ]
        })
    }

    proptest! {
        /// The fuzzing pass over the JSON mapping (`PROPTEST_CASES` sets how long): any
        /// document, whole or cut anywhere, answers an observation or a source error.
        #[test]
        fn fuzz_documents_through_a_mapping(doc in document(), cut in any::<prop::sample::Index>()) {
            let text = doc.to_string();
            let _ = shop().read(text.as_bytes());
            let _ = shop().read(&text.as_bytes()[..cut.index(text.len() + 1)]);
            let wrapped = serde_json::json!({"offer": doc, "hidden": false}).to_string();
            let _ = shop().read(wrapped.as_bytes());
        }

        #[test]
        fn no_document_makes_a_mapping_panic(body in prop::collection::vec(any::<u8>(), 0..256), text in ".{0,64}") {
            let _ = shop().read(&body);
            let doc = serde_json::json!({"offer": {"amount": text, "currency": text, "stock": text}, "hidden": text});
            let _ = shop().read(doc.to_string().as_bytes());
        }
    }
}
