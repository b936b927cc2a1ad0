//! The page reader's budget, tested at its worst: pages generated to be expensive (see
//! `support/hostile.rs`), up to a page source's `max_body`, each read with the bytes it
//! allocates counted. Whatever a page holds, reading it allocates at most 32× its size (plus a
//! fixed 1 MiB) at any moment, and ends within its time budget.
//!
//! Time in this debug build is only bounded loosely (the reader gives up at its budget); the
//! release figures come from `cargo run --release -p tidings-source --example hostile_pages`.

#[path = "support/hostile.rs"]
mod hostile;

use proptest::prelude::*;
use std::time::{Duration, Instant};
use tidings_source::config::MAX_PAGE_BODY;
use tidings_source::schema_org;

/// Peak bytes allocated while reading `page`, how long it took, and what it answered.
fn measure(page: &str) -> (u64, Duration, String) {
    let mut answer = String::new();
    let started = Instant::now();
    let counted = allocation_counter::measure(|| {
        answer = match schema_org::read(page.as_bytes(), None) {
            Ok(o) => format!("{} {}", o.price, o.currency),
            Err(e) => e.to_string(),
        };
    });
    (counted.bytes_max, started.elapsed(), answer)
}

fn within_bounds(kind: usize, size: usize, seed: usize) {
    let page = hostile::page(kind, size, seed);
    let (peak, took, answer) = measure(&page);
    let bound = 32 * page.len() as u64 + (1 << 20);
    assert!(
        peak <= bound,
        "{} ({} bytes): peak {peak} bytes allocated, bound {bound}; {answer}",
        hostile::KINDS[kind],
        page.len()
    );
    // The budget is 250 ms; an unoptimised build gets room to finish its last chunk.
    assert!(
        took < Duration::from_secs(3),
        "{} ({} bytes): {took:?}; {answer}",
        hostile::KINDS[kind],
        page.len()
    );
}

#[test]
fn every_hostile_page_at_max_body_is_read_within_its_budget() {
    for kind in 0..hostile::KINDS.len() {
        within_bounds(kind, MAX_PAGE_BODY, 0);
    }
}

/// Regression: the first kind, a 1.8 KB page, took 53 s and 2.9 GB.
#[test]
fn a_small_self_referencing_page_is_one_offer() {
    let page = hostile::page(0, 1_800, 0);
    let (peak, took, answer) = measure(&page);
    // Every offer it lists is itself: it states none.
    assert!(answer.contains("no schema.org Product offer"), "{answer}");
    assert!(peak < 1 << 20, "{peak} bytes");
    assert!(took < Duration::from_secs(1), "{took:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn generated_hostile_pages_stay_within_their_budget(
        kind in 0..hostile::KINDS.len(),
        size in 1_000usize..=MAX_PAGE_BODY,
        seed in 0usize..1_000,
    ) {
        within_bounds(kind, size, seed);
    }
}

/// Pieces of markup and JSON that the reader's states turn on, for [`fuzz_token_soup`].
const PIECES: &[&str] = &[
    r#"<div itemscope itemtype="https://schema.org/Product">"#,
    r#"<div itemprop="offers" itemscope itemtype="Offer">"#,
    r#"<span itemprop="price" content="12.99">"#,
    r#"<meta itemprop="priceCurrency" content="EUR">"#,
    r#"<span itemprop="sku offers price sku">"#,
    r#"<div vocab="https://schema.org/" typeof="Product">"#,
    r#"<span property="schema:price">"#,
    r#"<div property="offers" typeof="AggregateOffer">"#,
    r#"<script type="application/ld+json">"#,
    "</script>",
    "<script>",
    "<style>",
    "</style>",
    "<li>",
    "<p>",
    "</div>",
    "</span>",
    "<!--",
    "-->",
    "<![CDATA[",
    "]]>",
    r##"{"@type": "Product", "offers": {"@id": "#a"}}"##,
    r##"{"@id": "#a", "@type": "AggregateOffer", "priceCurrency": "EUR", "offers": [{"@id": "#a"}, "##,
    r#"{"@type": "Offer", "price": "1.00", "sku": "A"}"#,
    "[",
    "]",
    "{",
    "}",
    ",",
    "\"",
    "9.99",
    "InStock",
    " text ",
    "&amp;",
    "\u{0}",
    "\u{feff}",
];

proptest! {
    /// The fuzzing pass over the page reader (`PROPTEST_CASES` sets how long; CI runs a short
    /// pass, docs/security.md gives the long one): any sequence of these pieces and random
    /// bytes, read with and without an offer named, stays within the budget's bounds.
    #[test]
    fn fuzz_token_soup(
        pieces in prop::collection::vec(
            prop_oneof![
                4 => prop::sample::select(PIECES).prop_map(|p| p.as_bytes().to_vec()),
                1 => prop::collection::vec(any::<u8>(), 0..16),
            ],
            0..400,
        ),
        repeat in 1usize..200,
    ) {
        let unit: Vec<u8> = pieces.concat();
        let page = unit.repeat(repeat.min(64 * 1024 / unit.len().max(1)).max(1));
        let mut answer = None;
        let counted = allocation_counter::measure(|| {
            answer = Some(schema_org::read(&page, None));
            let _ = schema_org::read(&page, Some(&schema_org::OfferSelector::Sku("A".into())));
        });
        let bound = 32 * page.len() as u64 + (1 << 20);
        prop_assert!(counted.bytes_max <= bound, "peak {} > {bound}: {answer:?}", counted.bytes_max);
    }
}
