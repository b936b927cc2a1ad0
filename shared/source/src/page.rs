//! A product page as structured data: its JSON-LD blocks and its microdata items, both as JSON
//! nodes, so [`crate::schema_org`] reads one shape whichever a shop emits. The HTML is parsed
//! by html5ever (through `scraper`), as a browser would, never matched by patterns.

use scraper::{ElementRef, Html};
use serde_json::{Map, Value};

/// Nesting of microdata items followed; deeper items are left out (a page that nests items
/// this deep is not describing one product).
const MAX_ITEM_DEPTH: usize = 16;

/// What a page says about itself for search engines.
pub(crate) struct Page {
    /// Each `<script type="application/ld+json">` block, parsed or with why it could not be.
    pub(crate) json_ld: Vec<Result<Value, serde_json::Error>>,
    /// Each top-level microdata item (`itemscope` without `itemprop`), as a JSON-LD-like node:
    /// `@type` from `itemtype`, one key per property, several values as an array.
    pub(crate) microdata: Vec<Value>,
}

pub(crate) fn read(body: &[u8]) -> Page {
    let html = Html::parse_document(&String::from_utf8_lossy(body));
    let mut page = Page {
        json_ld: Vec::new(),
        microdata: Vec::new(),
    };
    for element in html.root_element().descendent_elements() {
        let e = element.value();
        if e.name() == "script" && e.attr("type").is_some_and(is_json_ld) {
            let text: String = element.text().collect();
            page.json_ld.push(serde_json::from_str(text.trim()));
        } else if e.attr("itemscope").is_some() && e.attr("itemprop").is_none() {
            page.microdata.push(item(element, 0));
        }
    }
    page
}

fn is_json_ld(media_type: &str) -> bool {
    media_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/ld+json"))
}

/// One microdata item: its properties are the `itemprop` elements below it that no nested
/// item claims.
fn item(scope: ElementRef<'_>, depth: usize) -> Value {
    let mut node = Map::new();
    if let Some(types) = scope.value().attr("itemtype") {
        let types: Vec<Value> = types.split_whitespace().map(Value::from).collect();
        node.insert("@type".into(), Value::Array(types));
    }
    let mut below: Vec<ElementRef<'_>> = scope.child_elements().collect();
    below.reverse();
    while let Some(element) = below.pop() {
        let e = element.value();
        let nested = e.attr("itemscope").is_some();
        if let Some(names) = e.attr("itemprop") {
            let value = match nested {
                true if depth < MAX_ITEM_DEPTH => item(element, depth + 1),
                true => Value::Null,
                false => Value::from(property(element)),
            };
            for name in names.split_whitespace() {
                add(&mut node, name, value.clone());
            }
        }
        if !nested {
            let children: Vec<_> = element.child_elements().collect();
            below.extend(children.into_iter().rev());
        }
    }
    Value::Object(node)
}

fn add(node: &mut Map<String, Value>, name: &str, value: Value) {
    match node.get_mut(name) {
        None => {
            node.insert(name.to_owned(), value);
        }
        Some(Value::Array(values)) => values.push(value),
        Some(one) => {
            let first = one.take();
            *one = Value::Array(vec![first, value]);
        }
    }
}

/// A property's value as the microdata specification reads it from its element; a `content`
/// attribute wins anywhere (`<span itemprop="price" content="12.99">12,99 €</span>`, which
/// shops write for search engines).
fn property(element: ElementRef<'_>) -> String {
    let e = element.value();
    let attr = |name| e.attr(name).unwrap_or_default().trim().to_owned();
    if let Some(content) = e.attr("content") {
        return content.trim().to_owned();
    }
    match e.name() {
        "meta" => attr("content"),
        "audio" | "embed" | "iframe" | "img" | "source" | "track" | "video" => attr("src"),
        "a" | "area" | "link" => attr("href"),
        "object" => attr("data"),
        "data" | "meter" => attr("value"),
        "time" if e.attr("datetime").is_some() => attr("datetime"),
        _ => element
            .text()
            .flat_map(str::split_whitespace)
            .collect::<Vec<_>>()
            .join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_ld_blocks_are_read_each_on_its_own() {
        let page = read(
            br#"<html><head>
            <script type="application/ld+json">{"@type": "Product", "name": "Tee"}</script>
            <script type="Application/LD+JSON; charset=utf-8">{"broken": </script>
            <script type="text/javascript">var x = {"@type": "Product"};</script>
            </head></html>"#,
        );
        assert_eq!(page.json_ld.len(), 2);
        assert_eq!(
            page.json_ld[0].as_ref().unwrap(),
            &json!({"@type": "Product", "name": "Tee"})
        );
        assert!(page.json_ld[1].is_err());
        assert!(page.microdata.is_empty());
    }

    #[test]
    fn microdata_items_become_nodes_with_their_own_properties() {
        let page = read(
            br#"<div itemscope itemtype="https://schema.org/Product">
              <h1 itemprop="name">Blue   tee</h1>
              <div><span itemprop="sku">TEE-1</span></div>
              <div itemprop="offers" itemscope itemtype="https://schema.org/Offer">
                <span itemprop="price" content="12.99">12,99 &euro;</span>
                <meta itemprop="priceCurrency" content="EUR">
                <link itemprop="availability" href="https://schema.org/InStock">
              </div>
              <div itemprop="offers" itemscope itemtype="https://schema.org/Offer">
                <data itemprop="price" value="15">15 &euro;</data>
              </div>
            </div>
            <div itemscope itemtype="https://schema.org/BreadcrumbList"></div>"#,
        );
        assert_eq!(page.microdata.len(), 2);
        assert_eq!(
            page.microdata[0],
            json!({
                "@type": ["https://schema.org/Product"],
                "name": "Blue tee",
                "sku": "TEE-1",
                "offers": [
                    {"@type": ["https://schema.org/Offer"], "price": "12.99",
                     "priceCurrency": "EUR", "availability": "https://schema.org/InStock"},
                    {"@type": ["https://schema.org/Offer"], "price": "15"},
                ],
            })
        );
    }
}
