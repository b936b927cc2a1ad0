//! A product page as structured data: its JSON-LD blocks and its microdata and RDFa Lite items,
//! all as JSON nodes, so [`crate::schema_org`] reads one shape whichever a shop emits.
//!
//! A page is hostile until read within its budget. It is tokenized by html5ever (the browsers'
//! tokenizer, linear in the page) but no DOM is built: a tree builder keeps every element of the
//! page (about 100 bytes each, so a page of `<i><i><i>…` costs 100× its size) and, on a page
//! nested a few hundred thousand deep, takes minutes. Instead the reader keeps a stack of open
//! elements of its own, bounded in depth, and only what an item says: its types, the property
//! values the reader uses, and its nested items. The text collected (script blocks and
//! property values) has a budget in bytes, the items a count, and the whole read a deadline,
//! checked between chunks of the page. Past any of them the page is [`TooComplex`].

use html5ever::TokenizerResult;
use html5ever::tendril::StrTendril;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{
    BufferQueue, Tag, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts,
};
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// Open elements followed; deeper ones are read as part of their ancestor at this depth (their
/// text counts, their items and properties are left out). Shop pages nest a few dozen deep.
const MAX_DEPTH: usize = 256;
/// How far down the open elements an end tag looks for its start; farther is a stray end tag.
const END_TAG_REACH: usize = 32;
/// Tags (counted as `<` bytes, before anything is tokenized) one page may hold: a large shop
/// page has tens of thousands; tokenizing takes ~150 ns a tag, so a page of nothing but tags
/// would cost 100 ms before the first item.
const MAX_TAGS: usize = 100_000;
/// Property names read from one `itemprop` or `property` attribute.
const MAX_NAMES: usize = 16;
/// Items (microdata or RDFa) one page may hold.
const MAX_ITEMS: usize = 10_000;
/// The page is fed to the tokenizer in chunks this large, and the deadline checked between them.
const CHUNK: usize = 64 * 1024;
/// What one page may take, whatever its size (a 2 MiB page reads in well under it).
pub(crate) const TIME_BUDGET: Duration = Duration::from_millis(250);

/// Property names whose text the reader uses; other properties keep only their nested items
/// (a `Product` under `mainEntity`), so a page cannot make the reader copy text it never reads.
const READ: &[&str] = &[
    "price",
    "lowPrice",
    "priceCurrency",
    "availability",
    "sku",
    "gtin",
    "gtin8",
    "gtin12",
    "gtin13",
    "gtin14",
    "url",
    "priceType",
    "offers",
    "priceSpecification",
];

/// Elements that have no end tag, so never stay open.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "keygen", "link", "meta", "param",
    "source", "track", "wbr",
];

/// Why a page was not read to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooComplex {
    #[error("page too complex: reading it took longer than {0:?}")]
    Time(Duration),
    #[error("page too complex: more than {0} bytes of text in its structured data")]
    Text(usize),
    #[error("page too complex: more than {MAX_ITEMS} microdata or RDFa items")]
    Items,
    #[error("page too complex: more than {MAX_TAGS} tags")]
    Tags,
    #[error("page too complex: its JSON-LD would take more than {0} bytes to hold")]
    Json(usize),
}

/// What a page says about itself for search engines.
pub(crate) struct Page {
    /// Each `<script type="application/ld+json">` block, parsed or with why it could not be.
    pub(crate) json_ld: Vec<Result<Value, serde_json::Error>>,
    /// Each top-level microdata or RDFa item (`itemscope` without `itemprop`, `typeof` without
    /// `property`), as a JSON-LD-like node: `@type` from `itemtype`, one key per property,
    /// several values as an array. An item that is the value of several property names is
    /// written once; the other names refer to it by `@id`.
    pub(crate) microdata: Vec<Value>,
}

/// What reading one page may still spend.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Budget {
    pub(crate) deadline: Instant,
    /// Bytes of text still to collect.
    pub(crate) text: usize,
    /// Bytes the page's JSON-LD may take once parsed (see [`json_cost`]).
    pub(crate) json: usize,
}

impl Budget {
    /// The budget for a page of `len` bytes: [`TIME_BUDGET`], and twice its size in text
    /// (property values may nest, each holding its descendants' text) plus 64 KiB.
    pub(crate) fn for_page(len: usize) -> Self {
        Budget {
            deadline: Instant::now() + TIME_BUDGET,
            text: len.saturating_mul(2).saturating_add(64 * 1024),
            json: len.saturating_mul(16).saturating_add(1 << 20),
        }
    }

    pub(crate) fn check_time(&self) -> Result<(), TooComplex> {
        match Instant::now() > self.deadline {
            true => Err(TooComplex::Time(TIME_BUDGET)),
            false => Ok(()),
        }
    }
}

pub(crate) fn read(body: &[u8], budget: Budget) -> Result<Page, TooComplex> {
    if body.iter().filter(|&&b| b == b'<').count() > MAX_TAGS {
        return Err(TooComplex::Tags);
    }
    let text = String::from_utf8_lossy(body);
    let reader = Reader {
        state: RefCell::new(State::new(budget)),
    };
    let tokenizer = Tokenizer::new(reader, TokenizerOpts::default());
    let queue = BufferQueue::default();
    let mut rest: &str = &text;
    while !rest.is_empty() {
        budget.check_time()?;
        let mut cut = rest.len().min(CHUNK);
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        queue.push_back(StrTendril::from_slice(&rest[..cut]));
        rest = &rest[cut..];
        while let TokenizerResult::Script(()) = tokenizer.feed(&queue) {}
        tokenizer
            .sink
            .state
            .borrow()
            .failed
            .clone()
            .map_or(Ok(()), Err)?;
    }
    tokenizer.end();
    budget.check_time()?;
    let mut state = tokenizer.sink.state.into_inner();
    // A script left open runs to the end of the page, as a browser reads it.
    state.script_ends();
    if let Some(failed) = state.failed {
        return Err(failed);
    }
    Ok(state.page())
}

struct Reader {
    state: RefCell<State>,
}

impl TokenSink for Reader {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        let mut state = self.state.borrow_mut();
        if state.failed.is_some() {
            return TokenSinkResult::Continue;
        }
        match token {
            Token::TagToken(tag) if tag.kind == TagKind::StartTag => state.start(&tag),
            Token::TagToken(tag) => {
                state.end(&tag);
                TokenSinkResult::Continue
            }
            Token::CharacterTokens(text) => {
                state.text(&text);
                TokenSinkResult::Continue
            }
            _ => TokenSinkResult::Continue,
        }
    }
}

/// One open element: what its descendants' properties belong to, and what it collects.
struct Open {
    name: html5ever::LocalName,
    /// The item its descendants' properties belong to.
    owner: Option<usize>,
    /// A property whose value is this element's text: its item and names.
    collects: Option<(usize, Vec<String>, String)>,
}

/// One microdata or RDFa item as it is read.
#[derive(Default)]
struct Item {
    types: Vec<String>,
    properties: Vec<(String, Prop)>,
    /// Whether it is some property's value (else it is a top-level item).
    nested: bool,
    /// How many property names it is the value of.
    uses: usize,
}

enum Prop {
    Text(String),
    Item(usize),
}

struct State {
    open: Vec<Open>,
    /// Where among `open` the elements that collect their text are (a text token costs them,
    /// not the whole stack).
    collecting: Vec<usize>,
    items: Vec<Item>,
    json_ld: Vec<Result<Value, serde_json::Error>>,
    /// The text of the JSON-LD block being read.
    script: Option<String>,
    text_left: usize,
    text_budget: usize,
    json_left: usize,
    json_budget: usize,
    failed: Option<TooComplex>,
}

impl State {
    fn new(budget: Budget) -> Self {
        State {
            open: Vec::new(),
            collecting: Vec::new(),
            items: Vec::new(),
            json_ld: Vec::new(),
            script: None,
            text_left: budget.text,
            text_budget: budget.text,
            json_left: budget.json,
            json_budget: budget.json,
            failed: None,
        }
    }

    /// Takes `n` bytes of the text budget.
    fn spend(&mut self, n: usize) -> bool {
        match self.text_left.checked_sub(n) {
            Some(left) => {
                self.text_left = left;
                true
            }
            None => {
                self.failed = Some(TooComplex::Text(self.text_budget));
                false
            }
        }
    }

    fn start(&mut self, tag: &Tag) -> TokenSinkResult<()> {
        let name = &*tag.name;
        let attr = |wanted: &str| attr_of(tag, wanted);
        let raw = match name {
            "script" => {
                if attr("type").is_some_and(is_json_ld) {
                    self.script = Some(String::new());
                }
                Some(TokenSinkResult::RawData(RawKind::ScriptData))
            }
            "style" | "xmp" | "iframe" | "noembed" | "noframes" | "noscript" => {
                Some(TokenSinkResult::RawData(RawKind::Rawtext))
            }
            "title" | "textarea" => Some(TokenSinkResult::RawData(RawKind::Rcdata)),
            "plaintext" => Some(TokenSinkResult::Plaintext),
            _ => None,
        };
        // Sloppy markup leaves these open; the next one closes the last (as the tree builder
        // would), so a list of unclosed items does not nest a thousand deep.
        if matches!(
            name,
            "li" | "p" | "option" | "dt" | "dd" | "tr" | "td" | "th"
        ) && self.open.last().is_some_and(|o| &*o.name == name)
        {
            self.close_top();
        }
        let void = VOID.contains(&name) || raw.is_some();
        if self.open.len() < MAX_DEPTH {
            self.element(tag, void);
        }
        raw.unwrap_or(TokenSinkResult::Continue)
    }

    /// A start tag within the depth followed: its item, its property, and, unless it is void,
    /// its place among the open elements.
    fn element(&mut self, tag: &Tag, void: bool) {
        let attr = |wanted: &str| attr_of(tag, wanted);
        let parent_owner = self.open.last().and_then(|o| o.owner);
        // Microdata, or RDFa Lite's `typeof`/`property` (older shop templates).
        let scope = attr("itemscope").is_some() || attr("typeof").is_some();
        let names = property_names(attr("itemprop"), attr("property"));
        let mut owner = parent_owner;
        if scope {
            if self.items.len() >= MAX_ITEMS {
                self.failed = Some(TooComplex::Items);
                return;
            }
            // RDFa's `vocab` is not joined on: a type is read by its last segment anyway.
            let types = attr("itemtype").or_else(|| attr("typeof"));
            let types = types
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            self.items.push(Item {
                types,
                ..Item::default()
            });
            owner = Some(self.items.len() - 1);
        }
        let mut collects = None;
        if let Some(into) = parent_owner.filter(|_| !names.is_empty()) {
            match (scope, owner) {
                (true, Some(item)) => {
                    self.items[item].nested = true;
                    self.items[item].uses = names.len();
                    for name in names {
                        self.items[into].properties.push((name, Prop::Item(item)));
                    }
                }
                _ => {
                    let names: Vec<String> = names
                        .into_iter()
                        .filter(|n| READ.contains(&n.as_str()))
                        .collect();
                    if !names.is_empty() {
                        match attribute_value(&tag.name, &attr) {
                            Some(value) => self.property(into, &names, value.trim()),
                            None if !void => collects = Some((into, names, String::new())),
                            None => self.property(into, &names, ""),
                        }
                    }
                }
            }
        }
        if !void {
            if collects.is_some() {
                self.collecting.push(self.open.len());
            }
            self.open.push(Open {
                name: tag.name.clone(),
                owner,
                collects,
            });
        }
    }

    fn property(&mut self, item: usize, names: &[String], value: &str) {
        if !self.spend(value.len() * names.len()) {
            return;
        }
        for name in names {
            self.items[item]
                .properties
                .push((name.clone(), Prop::Text(value.to_owned())));
        }
    }

    fn end(&mut self, tag: &Tag) {
        if &*tag.name == "script" {
            self.script_ends();
        }
        let reach = self.open.len().saturating_sub(END_TAG_REACH);
        if let Some(at) = self.open[reach..].iter().rposition(|o| o.name == tag.name) {
            while self.open.len() > reach + at {
                self.close_top();
            }
        }
    }

    /// The JSON-LD block being read ends: parsed, if its estimated size is within the budget.
    fn script_ends(&mut self) {
        let Some(script) = self.script.take() else {
            return;
        };
        match self.json_left.checked_sub(json_cost(&script)) {
            Some(left) => {
                self.json_left = left;
                self.json_ld.push(json_ld(&script));
            }
            None => self.failed = Some(TooComplex::Json(self.json_budget)),
        }
    }

    fn close_top(&mut self) {
        let Some(closed) = self.open.pop() else {
            return;
        };
        if let Some((item, names, text)) = closed.collects {
            self.collecting.pop();
            let words: Vec<&str> = text.split_whitespace().collect();
            self.property(item, &names, &words.join(" "));
        }
    }

    fn text(&mut self, text: &str) {
        if self.script.is_some() {
            if self.spend(text.len())
                && let Some(script) = &mut self.script
            {
                script.push_str(text);
            }
            return;
        }
        let collecting = self.collecting.len();
        if collecting == 0 || !self.spend(text.len() * collecting) {
            return;
        }
        for &at in &self.collecting {
            if let Some((_, _, collected)) = &mut self.open[at].collects {
                collected.push_str(text);
            }
        }
    }

    fn page(self) -> Page {
        let microdata = (0..self.items.len())
            .filter(|&i| !self.items[i].nested)
            .map(|i| self.node(i, 0))
            .collect();
        Page {
            json_ld: self.json_ld,
            microdata,
        }
    }

    /// Item `index` as a node. An item that is the value of several names is written under the
    /// first and referred to by `@id` under the others (see `Graph` in [`crate::schema_org`]).
    fn node(&self, index: usize, depth: usize) -> Value {
        let item = &self.items[index];
        let mut node = Map::new();
        if !item.types.is_empty() {
            let types = item.types.iter().map(|t| Value::from(t.as_str())).collect();
            node.insert("@type".into(), Value::Array(types));
        }
        if item.uses > 1 {
            node.insert("@id".into(), Value::from(format!("_:item{index}")));
        }
        let mut written = Vec::new();
        for (name, prop) in &item.properties {
            let value = match prop {
                Prop::Text(text) => Value::from(text.as_str()),
                Prop::Item(_) if depth >= MAX_ITEM_DEPTH => Value::Null,
                Prop::Item(nested) if written.contains(nested) => {
                    Value::Object(Map::from_iter([(
                        "@id".to_owned(),
                        Value::from(format!("_:item{nested}")),
                    )]))
                }
                Prop::Item(nested) => {
                    written.push(*nested);
                    self.node(*nested, depth + 1)
                }
            };
            add(&mut node, name, value);
        }
        Value::Object(node)
    }
}

/// The value of a start tag's attribute `name`, if it has one.
fn attr_of<'t>(tag: &'t Tag, name: &str) -> Option<&'t str> {
    tag.attrs
        .iter()
        .find(|a| &*a.name.local == name)
        .map(|a| &*a.value)
}

/// Nesting of items followed; deeper items are left out (a page that nests items this deep is
/// not describing one product).
const MAX_ITEM_DEPTH: usize = 16;

/// The property names an element gives, each once: its `itemprop`, else its RDFa `property`
/// without vocabulary (`schema:price` is `price`); at most [`MAX_NAMES`].
fn property_names(itemprop: Option<&str>, property: Option<&str>) -> Vec<String> {
    let mut names: Vec<String> = match (itemprop, property) {
        (Some(names), _) => (names.split_whitespace().take(MAX_NAMES))
            .map(str::to_owned)
            .collect(),
        (None, Some(names)) => (names.split_whitespace().take(MAX_NAMES))
            .map(rdfa_name)
            .collect(),
        (None, None) => Vec::new(),
    };
    names.sort_unstable();
    names.dedup();
    names
}

/// An RDFa property's name without its vocabulary: `schema:price` is `price`.
fn rdfa_name(name: &str) -> String {
    name.rsplit(['/', ':']).next().unwrap_or(name).to_owned()
}

fn is_json_ld(media_type: &str) -> bool {
    media_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/ld+json"))
}

/// A JSON-LD block, without what shop templates wrap it in: HTML comments before it
/// (`<!-- Product schema -->`), an old-style `<!-- … -->` or `<![CDATA[ … ]]>` around it.
fn json_ld(script: &str) -> Result<Value, serde_json::Error> {
    let mut text = script.trim();
    loop {
        if let Some(rest) = text.strip_prefix("<!--") {
            text = match rest.find("-->") {
                // A comment that ends before the JSON starts.
                Some(end) if !rest[..end].contains(['{', '[']) => rest[end + 3..].trim_start(),
                // A comment around the JSON.
                _ => rest.trim_end().trim_end_matches("-->").trim(),
            };
        } else if let Some(rest) = text
            .strip_prefix("//<![CDATA[")
            .or(text.strip_prefix("<![CDATA["))
        {
            text = rest
                .trim_end()
                .trim_end_matches("//]]>")
                .trim_end_matches("]]>")
                .trim();
        } else {
            break;
        }
    }
    serde_json::from_str(text)
}

/// About the most bytes `text` takes parsed as a `serde_json::Value`, counted without parsing
/// it: an object costs a map node (~640 bytes, however few its keys), any other value 96 bytes
/// (its 32 and an array's room to grow), a string its bytes. Small values are what makes JSON
/// grow: `[0,0,…]` is 2 bytes a value on the page and 32 to 96 in memory.
fn json_cost(text: &str) -> usize {
    let (mut cost, mut in_string, mut escaped) = (text.len(), false, false);
    for b in text.bytes() {
        match (in_string, escaped, b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => in_string = false,
            (true, false, _) => {}
            (false, _, b'"') => in_string = true,
            (false, _, b'{') => cost += 640,
            (false, _, b'[' | b',' | b':') => cost += 96,
            (false, _, _) => {}
        }
    }
    cost
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

/// A property's value when an attribute gives it, as the microdata specification reads it from
/// its element; a `content` attribute wins anywhere
/// (`<span itemprop="price" content="12.99">12,99 €</span>`, which shops write for search
/// engines). `None`: the element's text is the value.
fn attribute_value<'a>(
    name: &html5ever::LocalName,
    attr: &impl Fn(&str) -> Option<&'a str>,
) -> Option<&'a str> {
    if let Some(content) = attr("content") {
        return Some(content);
    }
    let from = match &**name {
        "meta" => "content",
        "audio" | "embed" | "iframe" | "img" | "source" | "track" | "video" => "src",
        "a" | "area" | "link" => "href",
        "object" => "data",
        "data" | "meter" => "value",
        "time" if attr("datetime").is_some() => "datetime",
        _ => return None,
    };
    Some(attr(from).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `html` read with its budget but for time (an unoptimised build on a busy machine is
    /// slow; the time budget has a test of its own).
    fn page(html: &str) -> Page {
        let budget = Budget {
            deadline: Instant::now() + Duration::from_secs(60),
            ..Budget::for_page(html.len())
        };
        read(html.as_bytes(), budget).unwrap()
    }

    #[test]
    fn a_page_read_past_its_deadline_is_too_complex() {
        let budget = Budget {
            deadline: Instant::now() - Duration::from_millis(1),
            ..Budget::for_page(10)
        };
        assert_eq!(
            read(b"<p>late</p>", budget).err(),
            Some(TooComplex::Time(TIME_BUDGET))
        );
    }

    #[test]
    fn json_ld_blocks_are_read_each_on_its_own() {
        let page = page(
            r#"<html><head>
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
    fn a_json_ld_block_left_open_runs_to_the_end_of_the_page() {
        let read = page(r#"<script type="application/ld+json">{"sku": "A"}"#);
        assert_eq!(read.json_ld[0].as_ref().unwrap(), &json!({"sku": "A"}));
    }

    /// Regression: a template's comment on the block's first line made it unreadable.
    #[test]
    fn a_json_ld_block_wrapped_or_preceded_by_comments_is_read() {
        for script in [
            "\n<!-- Product schema, generated -->\n{\"sku\": \"A\"}\n",
            "<!--\n{\"sku\": \"A\"}\n-->",
            "//<![CDATA[\n{\"sku\": \"A\"}\n//]]>",
            "<!-- a --> <!-- b -->{\"sku\": \"A\"}",
        ] {
            let html = format!(r#"<script type="application/ld+json">{script}</script>"#);
            let read = page(&html);
            assert_eq!(
                read.json_ld[0].as_ref().unwrap(),
                &json!({"sku": "A"}),
                "{script:?}"
            );
        }
    }

    #[test]
    fn microdata_items_become_nodes_with_the_properties_read() {
        let page = page(
            r#"<div itemscope itemtype="https://schema.org/Product">
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
                "sku": "TEE-1",
                "offers": [
                    {"@type": ["https://schema.org/Offer"], "price": "12.99",
                     "priceCurrency": "EUR", "availability": "https://schema.org/InStock"},
                    {"@type": ["https://schema.org/Offer"], "price": "15"},
                ],
            })
        );
    }

    #[test]
    fn rdfa_lite_items_read_as_microdata() {
        let page = page(
            r#"<div vocab="https://schema.org/" typeof="Product">
              <span property="name">Tee</span>
              <div property="offers" typeof="Offer">
                <span property="schema:price" content="9.50">9,50</span>
                <span property="priceCurrency">EUR</span>
              </div>
            </div>"#,
        );
        assert_eq!(
            page.microdata,
            [json!({
                "@type": ["Product"],
                "offers": {"@type": ["Offer"], "price": "9.50", "priceCurrency": "EUR"},
            })]
        );
    }

    /// Regression: an item's value was copied once per name in `itemprop`.
    #[test]
    fn an_item_under_several_names_is_written_once() {
        let names = ["offers priceSpecification"; 25].join(" ");
        let html = format!(
            r#"<div itemscope itemtype="Product"><div itemprop="{names}" itemscope itemtype="Offer"><span itemprop="price">1</span></div></div>"#
        );
        let page = page(&html);
        let product = &page.microdata[0];
        assert_eq!(product["offers"]["@id"], "_:item1");
        assert_eq!(product["priceSpecification"], json!({"@id": "_:item1"}));
    }

    #[test]
    fn deep_and_unclosed_markup_stays_within_its_bounds() {
        let deep = "<div>".repeat(50_000) + r#"<div itemscope itemtype="Product"></div>"#;
        assert!(page(&deep).microdata.is_empty(), "deeper than followed");
        let list = "<ul>".to_owned()
            + &"<li>".repeat(5_000)
            + r#"<li itemscope itemtype="Product"><span itemprop="sku">A</span>"#;
        assert_eq!(
            page(&list).microdata,
            [json!({"@type": ["Product"], "sku": "A"})]
        );
    }

    #[test]
    fn a_page_of_more_tags_than_allowed_is_refused_before_it_is_tokenized() {
        let dense = "<i>".repeat(MAX_TAGS + 1);
        let refused = read(dense.as_bytes(), Budget::for_page(dense.len()));
        assert_eq!(refused.err(), Some(TooComplex::Tags));
    }

    #[test]
    fn nested_property_text_is_held_to_the_text_budget() {
        let html = r#"<div itemscope>"#.to_owned()
            + &r#"<span itemprop="sku">"#.repeat(200)
            + &"x".repeat(10_000);
        let budget = Budget {
            deadline: Instant::now() + Duration::from_secs(60),
            text: 100_000,
            json: 1 << 20,
        };
        assert_eq!(
            read(html.as_bytes(), budget).err(),
            Some(TooComplex::Text(100_000))
        );
    }
}
