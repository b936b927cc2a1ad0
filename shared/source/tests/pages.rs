//! The `schema.org` format against product pages written for these tests (`tests/pages/`), one
//! per shape shops publish, each with the observation it must give or the refusal.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use tidings_domain::trigger::SourceErrorKind;
use tidings_source::schema_org::{self, OfferSelector};

fn page(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/pages/{name}.html", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// (price in minor units, currency, in stock) the page gives for `selector`.
fn seen(name: &str, selector: Option<OfferSelector>) -> (i64, String, bool) {
    let o = schema_org::read(&page(name), selector.as_ref())
        .unwrap_or_else(|e| panic!("{name} {selector:?}: {e}"));
    assert!(!o.paused, "{name}");
    (o.price, o.currency, o.in_stock)
}

/// The refusal the page gives for `selector`: its kind, and its detail holds `says`.
fn refused(name: &str, selector: Option<OfferSelector>, kind: SourceErrorKind, says: &str) {
    let e = schema_org::read(&page(name), selector.as_ref()).unwrap_err();
    assert_eq!(e.kind, kind, "{name}: {e}");
    assert!(e.detail.contains(says), "{name}: {e}");
}

fn sku(s: &str) -> Option<OfferSelector> {
    Some(OfferSelector::Sku(s.into()))
}

#[test]
fn each_page_shape_gives_its_observation() {
    let cases = [
        ("single-offer", (1299, "EUR", true)),
        ("graph-with-references", (2450, "USD", false)),
        ("aggregate-offer", (1999, "GBP", true)),
        ("sale-and-list-price", (7900, "EUR", true)),
        ("related-products", (4500, "CHF", true)),
        ("same-price-two-sellers", (1200, "JPY", true)),
        ("microdata", (3490, "EUR", false)),
        ("broken-json-ld-and-microdata", (999, "EUR", true)),
    ];
    for (name, (price, currency, in_stock)) in cases {
        assert_eq!(
            seen(name, None),
            (price, currency.to_owned(), in_stock),
            "{name}"
        );
    }
}

#[test]
fn a_page_of_several_prices_is_refused_unless_the_code_names_one_offer() {
    for name in ["variants", "aggregate-with-offers", "category-page"] {
        refused(name, None, SourceErrorKind::BadData, "ambiguous");
    }
    assert_eq!(seen("variants", sku("TEE-M")), (2100, "EUR".into(), false));
    assert_eq!(seen("variants", sku("TEE-L")), (2300, "EUR".into(), false));
    // GTIN-12 012345678905 is GTIN-13 0012345678905 and GTIN-14 00012345678905.
    let gtin = OfferSelector::gtin("00012345678905").unwrap();
    assert_eq!(seen("variants", Some(gtin)), (1900, "EUR".into(), true));
    let url = OfferSelector::for_url("https://shop.example/products/tee?variant=4003");
    assert_eq!(seen("variants", Some(url)), (2300, "EUR".into(), false));
    assert_eq!(
        seen("aggregate-with-offers", sku("GAME-7-GIFT")),
        (3500, "EUR".into(), true)
    );
    assert_eq!(
        seen("category-page", sku("KET-B")),
        (4200, "EUR".into(), true)
    );
    // The product's own identifiers name its only offer.
    let gtin = OfferSelector::gtin("4006381333931").unwrap();
    assert_eq!(
        seen("graph-with-references", Some(gtin)),
        (2450, "USD".into(), false)
    );
    refused(
        "variants",
        sku("TEE-XL"),
        SourceErrorKind::NotFound,
        "none of the page's 3 offers has sku:TEE-XL",
    );
}

#[test]
fn what_a_page_cannot_tell_is_refused_with_why() {
    refused(
        "broken-json-ld",
        None,
        SourceErrorKind::BadData,
        "JSON-LD block is broken",
    );
    refused(
        "no-product",
        None,
        SourceErrorKind::BadData,
        "no schema.org Product offer",
    );
    refused(
        "sold-out-no-price",
        None,
        SourceErrorKind::Empty,
        "no price",
    );
    refused("price-with-comma", None, SourceErrorKind::BadData, "12,99");
    refused(
        "single-offer",
        Some(OfferSelector::Sku("OTHER".into())),
        SourceErrorKind::NotFound,
        "sku:OTHER",
    );
    // Not HTML at all: this file.
    let e = schema_org::read(include_bytes!("pages.rs"), None).unwrap_err();
    assert_eq!(e.kind, SourceErrorKind::BadData, "{e}");
}

/// Any JSON value, a few levels deep, with the keys and types the reader looks for.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let key = prop::sample::select(vec![
        "@type",
        "@id",
        "@graph",
        "offers",
        "price",
        "lowPrice",
        "priceCurrency",
        "priceSpecification",
        "priceType",
        "availability",
        "sku",
        "gtin13",
        "url",
        "hasVariant",
        "isRelatedTo",
        "x",
    ]);
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::json!(f)),
        prop::sample::select(vec![
            "Product",
            "Offer",
            "AggregateOffer",
            "ProductGroup",
            "EUR",
            "jpy",
            "12.99",
            "-1",
            "1e400",
            "InStock",
            "https://schema.org/SoldOut",
            "#a",
            "",
        ])
        .prop_map(serde_json::Value::from),
        ".{0,12}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(key.clone(), inner, 0..6).prop_map(|m| {
                serde_json::Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

proptest! {
    #[test]
    fn no_page_makes_the_reader_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        text in ".{0,80}",
        doc in json_value(),
    ) {
        let _ = schema_org::read(&bytes, None);
        let _ = schema_org::read(text.as_bytes(), sku("A").as_ref());
        let ld = format!(r#"<script type="application/ld+json">{doc}</script>"#);
        let _ = schema_org::read(ld.as_bytes(), None);
        let _ = schema_org::read(ld.as_bytes(), sku("12.99").as_ref());
        let micro = format!(
            r#"<div itemscope itemtype="{text}"><span itemprop="offers" itemscope itemtype="https://schema.org/Offer"><meta itemprop="price" content="{text}"><meta itemprop="{text}" content="EUR"></span></div>"#
        );
        let _ = schema_org::read(micro.as_bytes(), None);
    }
}
