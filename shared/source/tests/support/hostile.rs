//! Hostile product pages: each kind repeats one structure (self-referencing offers, deep or
//! unclosed nesting, property names repeated, dense tags, huge JSON) until the page is `size`
//! bytes. Shared by the test that bounds the reader and the example that measures it.

/// Every kind of page generated.
pub const KINDS: &[&str] = &[
    "self-referencing AggregateOffer",
    "offers referring to one another",
    "one product, many offers",
    "itemprop names repeated",
    "nested property text",
    "nested items",
    "deep nesting",
    "unclosed list items",
    "dense tags",
    "JSON-LD numbers",
    "JSON-LD empty objects",
    "many items",
];

/// A page of `kind` (an index into [`KINDS`]), `size` bytes or just under; `seed` varies what
/// is repeated.
pub fn page(kind: usize, size: usize, seed: usize) -> String {
    let fill = |head: &str, unit: &str, tail: &str| {
        let room = size.saturating_sub(head.len() + tail.len());
        format!("{head}{}{tail}", unit.repeat(room / unit.len().max(1)))
    };
    let ld = |json_head: &str, unit: &str, json_tail: &str| {
        let head = format!(r#"<script type="application/ld+json">{json_head}"#);
        fill(&head, unit, &format!("{json_tail}</script>"))
    };
    let name = "x".repeat(seed % 64 + 1);
    match kind {
        0 => ld(
            r##"{"@type": "Product", "sku": "SKU", "offers": {"@type": "AggregateOffer", "@id": "#a", "priceCurrency": "EUR", "offers": ["##,
            r##"{"@id": "#a"},"##,
            r##"{"@id": "#a"}]}}"##,
        ),
        1 => ld(
            r##"{"@graph": [{"@type": "Product", "offers": [{"@id": "#o0"}]}, "##,
            &format!(
                r##"{{"@type": "AggregateOffer", "@id": "#o{}", "offers": [{{"@id": "#o0"}}, {{"@id": "#o1"}}]}},"##,
                seed % 2
            ),
            r#"{}]}"#,
        ),
        2 => ld(
            &format!(r#"{{"@type": "Product", "sku": "{name}", "offers": ["#),
            r#"{"@type": "Offer", "price": "1.00", "priceCurrency": "EUR"},"#,
            r#"{}]}"#,
        ),
        3 => {
            let names = format!("{} ", "offers price sku").repeat(size / 64 / 17 + 1);
            fill(
                r#"<div itemscope itemtype="Product">"#,
                &format!(r#"<span itemprop="{names}">{name}</span>"#),
                "</div>",
            )
        }
        4 => fill(
            r#"<div itemscope itemtype="Product">"#,
            &format!(r#"<span itemprop="sku">{}"#, &name[..name.len().min(4)]),
            "",
        ),
        5 => fill(
            r#"<div itemscope itemtype="Product">"#,
            r#"<div itemprop="offers priceSpecification" itemscope itemtype="AggregateOffer">"#,
            "",
        ),
        6 => fill("", "<div>", r#"<div itemscope itemtype="Product"></div>"#),
        7 => fill("<ul>", "<li>", ""),
        8 => fill("", ["<i>", "<b>", "<p>", "<a>"][seed % 4], ""),
        9 => ld("[", "0,", "0]"),
        10 => ld("[", "{},", "{}]"),
        11 => fill("", r#"<i itemscope itemtype="Product"></i>"#, ""),
        _ => String::new(),
    }
}
