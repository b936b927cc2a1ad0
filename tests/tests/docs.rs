//! The docs name only what exists: every relative link in README.md and docs/ points at a file
//! (and a heading, with an anchor), every repository path they name in backticks is there, and
//! every `TIDINGS_*` setting they name is read by some code.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![
        repo().join("README.md"),
        repo().join("migrations/README.md"),
    ];
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages
}

/// GitHub's anchor for a heading.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(page: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(page)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// `](target)` of every Markdown link.
fn links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_relative_link_points_at_a_file_and_heading_that_exist() {
    let (mut broken, mut checked) = (Vec::new(), 0);
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for link in links(&text) {
            if link.starts_with("http") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", page.display()));
            } else if !fragment.is_empty()
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&target).contains(fragment)
            {
                broken.push(format!("{}: {link}: no such heading", page.display()));
            }
        }
    }
    assert!(checked > 40, "only {checked} links found");
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn every_repository_path_named_in_backticks_exists() {
    const TOP: [&str; 9] = [
        "api/",
        "cli/",
        "deploy/",
        "detector/",
        "dispatcher/",
        "migrations/",
        "pusher/",
        "shared/",
        "tests/",
    ];
    let (mut missing, mut checked) = (Vec::new(), 0);
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (i, code) in text.split('`').enumerate() {
            // Odd pieces are inside backticks.
            if i % 2 == 0 || code.contains(' ') || code.contains('<') || code.contains('*') {
                continue;
            }
            if !TOP.iter().any(|t| code.starts_with(t)) {
                continue;
            }
            let path = code.split(':').next().unwrap_or(code);
            checked += 1;
            if !repo().join(path).exists() {
                missing.push(format!("{}: `{code}`", page.display()));
            }
        }
    }
    assert!(checked > 40, "only {checked} paths found");
    assert!(missing.is_empty(), "{missing:#?}");
}

/// Every `TIDINGS_*` name the docs give is read somewhere: a flag's `env = "…"`, the stack
/// script, the benchmarks or the tests.
#[test]
fn every_setting_named_in_the_docs_is_read_by_the_code() {
    let mut code = String::new();
    let mut stack = vec![repo()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "docs" | "node_modules") {
                    stack.push(path);
                }
            } else if name.ends_with(".rs")
                || name.ends_with(".yaml")
                || name.ends_with(".env")
                || name.ends_with(".js")
                || name == "stack"
                || name == "run"
            {
                code.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
            }
        }
    }
    let (mut unknown, mut named) = (BTreeSet::new(), BTreeSet::new());
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for piece in text.split("TIDINGS_").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            let name = name.trim_end_matches('_');
            if name.is_empty()
                || name.ends_with("FILE") && code.contains(&format!("TIDINGS_{name}"))
            {
                continue;
            }
            named.insert(name.to_owned());
            if !code.contains(&format!("TIDINGS_{name}")) {
                unknown.insert(format!("{}: TIDINGS_{name}", page.display()));
            }
        }
    }
    assert!(named.len() > 50, "only {} settings found", named.len());
    assert!(unknown.is_empty(), "{unknown:#?}");
}
