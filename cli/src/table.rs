//! Human output: aligned columns, and JSON values as short text.

use serde::Serialize;
use serde_json::Value;

/// An answer's field as a table cell, shown as its JSON: strings and times bare, none as `—`.
pub fn cell<T: Serialize + ?Sized>(v: &T) -> String {
    text(&serde_json::to_value(v).unwrap_or(Value::Null))
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "—".to_owned(),
        Value::String(s) => shown(s),
        other => other.to_string(),
    }
}

/// Foreign text (a receiver's answer, a dead letter, an error) as a terminal may show it:
/// control characters, which could move the cursor, recolour or retitle an operator's terminal,
/// and the bidirectional overrides that reorder what is read, are written as escapes (`\u{1b}`).
/// `--json` output is escaped by JSON itself.
pub fn shown(foreign: &str) -> String {
    let mut out = String::with_capacity(foreign.len());
    for c in foreign.chars() {
        let reorders = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if c.is_control() || reorders {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// Prints `rows` under `headers`, each column as wide as its widest cell; a cell longer than 60
/// characters is cut (the full value is in `--json`).
pub fn print(headers: &[&str], rows: &[Vec<String>]) {
    const MAX: usize = 60;
    let cut = |s: &str| -> String {
        if s.chars().count() > MAX {
            let head: String = s.chars().take(MAX - 1).collect();
            format!("{head}…")
        } else {
            s.to_owned()
        }
    };
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| cut(c)).collect())
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_uppercase()).collect());
    for r in rows {
        line(r);
    }
}

/// Prints `items` (answers of one type) under `columns`: each a header and the JSON Pointer of
/// its value in an item (`/detected/at`).
pub fn list<T: Serialize>(items: &[T], columns: &[(&str, &str)]) {
    let headers: Vec<&str> = columns.iter().map(|(h, _)| *h).collect();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|item| {
            let v = serde_json::to_value(item).unwrap_or(Value::Null);
            columns
                .iter()
                .map(|(_, at)| text(v.pointer(at).unwrap_or(&Value::Null)))
                .collect()
        })
        .collect();
    print(&headers, &rows);
}

/// A listing as the command line shows it: the items as JSON for scripts (`--json`), else
/// [`list`]'s table.
pub fn listing<T: Serialize>(json_out: bool, items: &[T], columns: &[(&str, &str)]) {
    if json_out {
        println!("{}", cell(items));
    } else {
        list(items, columns);
    }
}

/// Prints `key: value` lines for the named fields of answer `v`.
pub fn fields<T: Serialize>(v: &T, names: &[&str]) {
    let v = serde_json::to_value(v).unwrap_or(Value::Null);
    let width = names.iter().map(|n| n.len()).max().unwrap_or(0) + 1;
    for n in names {
        println!("{:<width$} {}", format!("{n}:"), text(&v[*n]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: a receiver's answer of up to 1 KiB reached the terminal as it was.
    #[test]
    fn foreign_text_reaches_the_terminal_without_control_characters() {
        let answer = "ok\u{1b}]0;owned\u{7}\u{1b}[2J\r\u{202e}txt.exe\u{9b}";
        let cell = text(&Value::from(answer));
        assert_eq!(
            cell,
            "ok\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{d}\\u{202e}txt.exe\\u{9b}"
        );
        assert!(!cell.chars().any(char::is_control));
        assert_eq!(shown("Größe: 12,99 €"), "Größe: 12,99 €");
    }
}
