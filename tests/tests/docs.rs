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

/// What every generated page starts with; the size bound is for the hand-written ones (the
/// generated are checked by regenerating them: this file's api reference, dashboards.rs's
/// metrics).
const GENERATED_PAGE: &str = "<!-- generated by tests/tests/";

/// What this file's generated page starts with.
const GENERATED: &str = "<!-- generated by tests/tests/docs.rs";

#[test]
fn docs_stay_a_reference_of_at_most_110_kb() {
    let size: u64 = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .filter(|page| !page.starts_with(GENERATED_PAGE))
        .map(|page| page.len() as u64)
        .sum();
    assert!(
        size <= 110_000,
        "docs/ holds {size} bytes, more than 110 KB"
    );
}

/// A figure that follows `name ` in `line` (`Postgres 137` → 137).
fn figure_after(line: &str, name: &str) -> f64 {
    // A word is followed by a space before its figure; `(~` is not.
    let marker = if name.ends_with(char::is_alphanumeric) {
        format!("{name} ")
    } else {
        name.to_owned()
    };
    let rest = line
        .split(&marker)
        .nth(1)
        .unwrap_or_else(|| panic!("no `{name} N` in {line}"));
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ',')
        .filter(|c| *c != ',')
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("`{name}` in {line}"))
}

/// The line of `text` that starts with `start`.
fn line_starting<'a>(text: &'a str, start: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start:?}"))
}

fn thousands(n: f64) -> String {
    let s = format!("{:.0}", n);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// scaling.md's capacity model, computed from the current figures in benchmarks.md.
fn capacity_model(benchmarks: &str) -> String {
    // The pipeline benchmark's CPU per `sent` notification, by process; the fake catalog and
    // push sink are the benchmark's, not a deployment's, so they are left out.
    let cpu = line_starting(benchmarks, "| CPU per `sent` notification |");
    let processes = [
        "Postgres",
        "pusher",
        "nats-server",
        "dispatcher",
        "detector",
    ];
    let per: Vec<f64> = processes.iter().map(|p| figure_after(cpu, p)).collect();
    let total: f64 = per.iter().sum();
    let dedup = line_starting(benchmarks, "| nats-server memory per key in the window |");
    let dedup_key_bytes: f64 = dedup
        .split('|')
        .nth(2)
        .and_then(|cell| cell.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no figure in {dedup}"));
    let detector = line_starting(benchmarks, "| peak RSS |");
    let kib_per_watch = figure_after(detector, "(~");
    // Measured with psql while timing migration 0010: 1,000,000 rows with their indexes took
    // 912 MiB.
    const OUTBOX_ROW_BYTES: f64 = 956.0;
    const KIB_PER_WATCH_WITH_BASELINE: f64 = 1.0;
    // Assumptions: peaks at 10 × the month's average, rows kept up to 37 days (30 of
    // retention and a week), a 15 min duplicate window.
    const PEAK: f64 = 10.0;
    const KEPT_DAYS: f64 = 37.0;
    const WINDOW_S: f64 = 900.0;
    let gib = 1024.0 * 1024.0 * 1024.0;
    let mut out = String::new();
    out.push_str(&format!(
        "Measured inputs:\n\n| unit | cost | from |\n|---|---|---|\n\
         | CPU per `sent` notification, all Tidings processes | {total:.0} µs: {} | `bench pipeline` |\n\
         | outbox row with its indexes | ~{OUTBOX_ROW_BYTES:.0} bytes | `psql`, while timing migration 0010 |\n\
         | detector watchlist | {kib_per_watch} KiB per watch, ~{KIB_PER_WATCH_WITH_BASELINE:.0} KiB with a sent baseline | `bench detector` |\n\
         | nats-server per dedup key in the duplicate window | {dedup_key_bytes:.0} bytes | `bench dedup` |\n\n",
        processes
            .iter()
            .zip(&per)
            .map(|(p, c)| format!("{p} {c:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    out.push_str(
        "Assumed, not measured: peaks at 10 × the month's average rate, rows kept up to 37 days \
         (30 of retention and a week), one Postgres primary. At the peak rate:\n\n\
         | watches | notifications per watch per month | average /s | peak /s | cores | of which Postgres | outbox on disk | NATS duplicate window | detector memory (all shards) |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    let mut largest = (0.0, 0.0);
    for watches in [1e6, 1e7, 1e8] {
        for per_month in [1.0, 10.0, 100.0] {
            let average = watches * per_month / (30.0 * 86_400.0);
            let peak = average * PEAK;
            let cores = peak * total / 1e6;
            let postgres = peak * per[0] / 1e6;
            let outbox = watches * per_month * KEPT_DAYS / 30.0 * OUTBOX_ROW_BYTES / gib;
            let window = peak * WINDOW_S * dedup_key_bytes / (1024.0 * 1024.0);
            let memory = (
                watches * kib_per_watch / (1024.0 * 1024.0),
                watches * KIB_PER_WATCH_WITH_BASELINE / (1024.0 * 1024.0),
            );
            largest = (peak, cores);
            out.push_str(&format!(
                "| {} M | {per_month:.0} | {} | {} | {cores:.2} | {postgres:.2} | {} GiB | {} MiB | {:.1}–{:.1} GiB |\n",
                thousands(watches / 1e6),
                if average < 10.0 { format!("{average:.2}") } else { thousands(average) },
                if peak < 10.0 { format!("{peak:.1}") } else { thousands(peak) },
                thousands(outbox.max(1.0)),
                thousands(window.max(1.0)),
                memory.0,
                memory.1,
            ));
        }
    }
    let (peak, cores) = largest;
    out.push_str(&format!(
        "\nOf the cores, {:.0} % are the pushers', {:.0} % Postgres', {:.0} % nats-server's and \
         {:.0} % the dispatchers'. At {} notifications/s that is {:.1} cores of pushers, {:.1} of \
         Postgres on one primary and {:.1} of dispatchers.\n",
        100.0 * per[1] / total,
        100.0 * per[0] / total,
        100.0 * per[2] / total,
        100.0 * per[3] / total,
        thousands(peak),
        peak * per[1] / 1e6,
        peak * per[0] / 1e6,
        peak * per[3] / 1e6,
    ));
    let _ = cores;
    out
}

#[test]
fn the_capacity_model_is_computed_from_the_current_benchmarks() {
    let benchmarks = std::fs::read_to_string(repo().join("docs/benchmarks.md")).unwrap();
    let path = repo().join("docs/scaling.md");
    let scaling = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- capacity:begin -->\n", "<!-- capacity:end -->");
    let head = &scaling[..scaling
        .find(begin)
        .expect("scaling.md has the capacity markers")];
    let tail = &scaling[scaling
        .find(end)
        .expect("scaling.md has the capacity end marker")..];
    let expected = format!("{head}{begin}{}{tail}", capacity_model(&benchmarks));
    tidings_tests::harness::assert_generated(&path, &expected, "the capacity model test");
}

/// The first sentence of `text`, on one line, with table pipes escaped.
fn first_sentence(text: &str) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let end = one_line.find(". ").map_or(one_line.len(), |i| i + 1);
    one_line[..end].replace('|', "\\|")
}

/// docs/api.md: every route of the OpenAPI document by audience and tag, with its port, its
/// credentials and the statuses it answers.
fn api_reference(doc: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "{GENERATED} from the OpenAPI document (`tidings-api openapi`); TIDINGS_BLESS=1 rewrites it -->\n\
         # API reference\n\n\
         Every route the api serves. Public routes are on the public port (`TIDINGS_API_LISTEN`), \
         operator routes and `/metrics` on the ops port (`TIDINGS_OPS_LISTEN`) only. Credentials \
         are bearer tokens: `device_token` (from `POST /v1/devices`), `client_key` (`tck_…`, \
         issued by an operator), `admin_token` (the operator token). Errors are \
         `application/problem+json` (RFC 9457). The full schemas: `GET /openapi.json`.\n"
    );
    let mut routes: Vec<(String, String, String, &serde_json::Value)> = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let tag = op["tags"][0].as_str().unwrap_or("other").to_owned();
            routes.push((tag, path.clone(), method.to_uppercase(), op));
        }
    }
    let tags: Vec<(String, String)> = doc["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let name = t["name"].as_str().unwrap().to_owned();
            (
                name,
                first_sentence(t["description"].as_str().unwrap_or("")),
            )
        })
        .collect();
    for (tag, about) in &tags {
        let mut of_tag: Vec<_> = routes.iter().filter(|r| &r.0 == tag).collect();
        if of_tag.is_empty() {
            continue;
        }
        of_tag.sort_by(|a, b| (&a.1, &a.2).cmp(&(&b.1, &b.2)));
        let _ = write!(
            out,
            "\n## {tag}\n\n{about}\n\n| route | port | credentials | answers | what |\n|---|---|---|---|---|\n"
        );
        for (_, path, method, op) in of_tag {
            let port = if path.starts_with("/v1/admin") || path == "/metrics" {
                "ops"
            } else {
                "public"
            };
            let credentials: Vec<String> = op["security"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|s| s.as_object().unwrap().keys().cloned())
                .collect();
            let credentials = if credentials.is_empty() {
                "none".to_owned()
            } else {
                credentials.join(" or ")
            };
            let answers: Vec<&str> = op["responses"]
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            // The handler's doc comment, else what its success answer is.
            let success = op["responses"]
                .as_object()
                .unwrap()
                .iter()
                .find(|(code, _)| code.starts_with('2'))
                .and_then(|(_, r)| r["description"].as_str());
            let what = op["summary"]
                .as_str()
                .or(op["description"].as_str())
                .or(success)
                .map(first_sentence)
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "| `{method} {path}` | {port} | {credentials} | {} | {what} |",
                answers.join(", ")
            );
        }
    }
    let untagged = routes
        .iter()
        .filter(|r| !tags.iter().any(|(t, _)| *t == r.0))
        .count();
    assert_eq!(untagged, 0, "every route has a tag the document lists");
    out
}

#[test]
fn the_api_reference_is_the_openapi_document_as_generated() {
    let page = api_reference(tidings_api::openapi_document());
    assert!(
        page.contains("`POST /v1/devices` | public | none |"),
        "{page}"
    );
    assert!(
        page.contains("`GET /v1/admin/outbox` | ops | admin_token |"),
        "{page}"
    );
    tidings_tests::harness::assert_generated(
        &repo().join("docs/api.md"),
        &page,
        "the OpenAPI document (tests/tests/docs.rs)",
    );
}

/// How long each table keeps a row, and why it is there: what the catalogs cannot say.
const TABLES: &[(&str, &str, &str)] = &[
    (
        "devices",
        "A browser, a webhook endpoint or an email address that receives notifications.",
        "until removed, then purged once no retained outbox row refers to it.",
    ),
    (
        "push_subscriptions",
        "A device's Web Push subscription, webhook URL and sealed secret, or email address and sealed link key.",
        "until replaced or gone, then purged like devices.",
    ),
    (
        "email_confirmations",
        "A confirmation link mailed to an email device (its token's hash); what the mail limits count.",
        "with its subscription.",
    ),
    (
        "watches",
        "What a device watches: an item and its triggers.",
        "until removed, then purged like devices.",
    ),
    (
        "baselines",
        "The last value notified per watch and trigger.",
        "as long as its watch.",
    ),
    (
        "outbox",
        "One row per notification: its detection, state, attempts and outcome; weekly partitions.",
        "`TIDINGS_RETENTION` (30 days), whole weeks once every row is decided.",
    ),
    (
        "outbox_attempts",
        "Every push attempt but a row's last (which is on the row).",
        "with its outbox week.",
    ),
    (
        "idempotency_keys",
        "An `Idempotency-Key` and the answer it gave.",
        "24 hours.",
    ),
    (
        "notifications_shown",
        "What a device showed for a notification.",
        "with its notification's week.",
    ),
    (
        "api_clients",
        "API clients and their key's hash.",
        "for ever; revoked ones stay listed.",
    ),
    (
        "operator_actions",
        "The operators' audit trail.",
        "`TIDINGS_AUDIT_RETENTION` (365 days).",
    ),
];

/// docs/data-model.md: every table the migrations make, its columns, which service may write it
/// (from the grants) and how long it keeps a row.
#[tokio::test]
async fn the_data_model_page_is_the_schema_as_generated() {
    use std::fmt::Write as _;
    let db = tidings_tests::harness::TestDb::new().await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition \
           AND c.relname <> '_sqlx_migrations' ORDER BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let described: BTreeSet<&str> = TABLES.iter().map(|(t, _, _)| *t).collect();
    let made: BTreeSet<&str> = tables.iter().map(String::as_str).collect();
    assert_eq!(
        described, made,
        "TABLES describes exactly the tables the migrations make"
    );
    let mut out = format!(
        "{GENERATED} from the migrated schema and its grants; TIDINGS_BLESS=1 rewrites it -->\n\
         # Data model\n\n\
         Postgres holds every table; `migrate` (the schema owner) makes them. A service writes a \
         table only where its role has the grant (`may write`; every service reads what it \
         needs). Partitions, retention rounds and purges: [design.md](design.md#retention).\n"
    );
    for (table, what, kept) in TABLES {
        let writers: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT replace(grantee::text, 'tidings_', '') FROM information_schema.role_table_grants \
             WHERE table_name = $1 AND grantee::text LIKE 'tidings\\_%' \
               AND privilege_type IN ('INSERT', 'UPDATE', 'DELETE') ORDER BY 1",
        )
        .bind(table)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        let column_writers: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT replace(grantee::text, 'tidings_', '') FROM information_schema.column_privileges \
             WHERE table_name = $1 AND grantee::text LIKE 'tidings\\_%' \
               AND privilege_type IN ('INSERT', 'UPDATE') ORDER BY 1",
        )
        .bind(table)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        let writers: BTreeSet<String> = writers.into_iter().chain(column_writers).collect();
        let writers = if writers.is_empty() {
            "none (the schema owner)".to_owned()
        } else {
            writers.into_iter().collect::<Vec<_>>().join(", ")
        };
        let columns: Vec<(String, String, bool)> = sqlx::query_as(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull \
             FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 \
               AND NOT a.attisdropped ORDER BY a.attnum",
        )
        .bind(table)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        let columns: Vec<String> = columns
            .into_iter()
            .map(|(name, ty, not_null)| format!("`{name}` {ty}{}", if not_null { "" } else { "?" }))
            .collect();
        let _ = write!(
            out,
            "\n## {table}\n\n{what} Kept: {kept} May write: {writers}.\n\nColumns (`?`: may be null): {}.\n",
            columns.join(", ")
        );
    }
    tidings_tests::harness::assert_generated(
        &repo().join("docs/data-model.md"),
        &out,
        "the migrated schema (tests/tests/docs.rs)",
    );
}
