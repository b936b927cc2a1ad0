//! The rollback rule (migrations/README.md): a migration after the last released one may only
//! add what the previous release can ignore, or say why the previous release still works.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

mod support;

use support::{migrations_dir, released};

/// Statements the previous release may not survive, as upper-case fragments of a statement.
const BREAKING: &[&str] = &[
    "DROP TABLE",
    "DROP COLUMN",
    "RENAME ",
    "SET NOT NULL",
    "DROP CONSTRAINT",
    "DROP FUNCTION",
    "DROP TRIGGER",
    "DROP INDEX",
    "CREATE OR REPLACE FUNCTION",
    "CREATE TRIGGER",
];

/// The statements of `sql` (comments removed, whitespace folded, upper case) that could break the
/// release before it, unless the file carries a `-- compatible:` note.
fn breaking(sql: &str) -> Vec<String> {
    if sql
        .lines()
        .any(|l| l.trim_start().starts_with("-- compatible:"))
    {
        return Vec::new();
    }
    let code: String = sql
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ");
    let created = tables_created(&code);
    code.split(';')
        .map(|s| {
            s.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_uppercase()
        })
        .filter(|s| {
            BREAKING.iter().any(|b| s.contains(b))
                || locks_a_live_table(s, &created)
                || (s.contains("ALTER COLUMN") && s.contains(" TYPE "))
                || (s.contains("ADD COLUMN") && s.contains("NOT NULL") && !s.contains("DEFAULT"))
        })
        .collect()
}

/// The tables `code` creates: an index on one of them locks nothing anyone else uses.
fn tables_created(code: &str) -> Vec<String> {
    let words: Vec<String> = code
        .split(|c: char| c.is_whitespace() || c == '(')
        .filter(|w| !w.is_empty())
        .map(str::to_uppercase)
        .collect();
    words
        .windows(3)
        .filter(|w| w[0] == "CREATE" && w[1] == "TABLE")
        .map(|w| {
            if w[2] == "IF" {
                String::new()
            } else {
                w[2].clone()
            }
        })
        .chain(
            words
                .windows(6)
                .filter(|w| w[0] == "CREATE" && w[1] == "TABLE" && w[2] == "IF")
                .map(|w| w[5].clone()),
        )
        .filter(|t| !t.is_empty())
        .collect()
}

/// An index build that takes a `SHARE` lock (no `CONCURRENTLY`) on a table this file did not
/// create: every write to that table waits for the whole build.
fn locks_a_live_table(statement: &str, created: &[String]) -> bool {
    let words: Vec<&str> = statement.split_whitespace().collect();
    let builds_index = words.first() == Some(&"CREATE") && words.contains(&"INDEX");
    if !builds_index || words.contains(&"CONCURRENTLY") {
        return false;
    }
    let table = words
        .iter()
        .position(|w| *w == "ON")
        .and_then(|i| words.get(i + 1))
        .map(|t| t.trim_start_matches("ONLY").split('(').next().unwrap_or(""));
    !table.is_some_and(|t| created.iter().any(|c| c == t))
}

/// Postgres refuses `CONCURRENTLY` inside a transaction, and runs a file of several statements
/// as one: such a migration must be marked `-- no-transaction` and hold that one statement.
fn concurrent_build_runs_alone(sql: &str) -> Result<(), String> {
    if !sql.to_uppercase().contains("CONCURRENTLY") {
        return Ok(());
    }
    if !sql.starts_with("-- no-transaction") {
        return Err("a CONCURRENTLY build needs `-- no-transaction` as its first line".into());
    }
    let code: String = sql
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ");
    let statements = code.split(';').filter(|s| !s.trim().is_empty()).count();
    if statements == 1 {
        Ok(())
    } else {
        Err(format!(
            "{statements} statements beside a CONCURRENTLY build: Postgres runs them as one \
             transaction and refuses the build; give it a migration of its own"
        ))
    }
}

#[test]
fn every_unreleased_migration_keeps_the_previous_release_running() {
    let released = released();
    assert!(released >= 13, "the released line went back to {released}");
    let mut unreleased = 0;
    for entry in std::fs::read_dir(migrations_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(version) = name.split('_').next().and_then(|v| v.parse::<i64>().ok()) else {
            continue;
        };
        if version <= released {
            continue;
        }
        unreleased += 1;
        let sql = std::fs::read_to_string(&path).unwrap();
        if let Err(why) = concurrent_build_runs_alone(&sql) {
            panic!("{name}: {why}");
        }
        let found = breaking(&sql);
        assert!(
            found.is_empty(),
            "{name} would break the release before it on a rollback, or stall writes to a live \
             table (migrations/README.md): {found:?}; split it (expand now, contract a release \
             later), build the index CONCURRENTLY, or say why it is safe in a `-- compatible:` \
             comment"
        );
    }
    // Every migration this build carries is on disk: the rule saw all of them.
    assert_eq!(
        tidings_store::schema::MIGRATOR
            .iter()
            .filter(|m| m.version > released)
            .count(),
        unreleased
    );
}

#[test]
fn the_rule_refuses_what_the_previous_release_cannot_survive() {
    for sql in [
        "ALTER TABLE outbox DROP COLUMN last_error;",
        "ALTER TABLE outbox RENAME COLUMN last_error TO error;",
        "alter table outbox\n  alter column attempt type bigint;",
        "ALTER TABLE devices ALTER COLUMN tz SET NOT NULL;",
        "ALTER TABLE devices ADD COLUMN locale text NOT NULL;",
        "DROP TABLE attempts;",
        "ALTER TABLE outbox DROP CONSTRAINT outbox_reason_check;",
        "CREATE OR REPLACE FUNCTION outbox_guard() RETURNS trigger AS $$ BEGIN RETURN NEW; END $$;",
        "DROP INDEX outbox_due;",
        "CREATE INDEX devices_client ON devices (client_id) WHERE client_id IS NOT NULL;",
        "create unique index outbox_key on only outbox(key);",
        "CREATE TABLE audit (id bigint);\nCREATE INDEX outbox_by_key ON outbox (key);",
    ] {
        assert!(!breaking(sql).is_empty(), "{sql}");
    }
}

#[test]
fn the_rule_lets_through_what_only_adds_or_says_why() {
    for sql in [
        "ALTER TABLE devices ADD COLUMN locale text;",
        "CREATE TYPE channel AS ENUM ('web_push', 'webhook');",
        "ALTER TABLE devices ADD COLUMN locale text NOT NULL DEFAULT 'en';",
        "CREATE TABLE webhooks (id uuid PRIMARY KEY);\nCREATE INDEX webhooks_by_id ON webhooks (id);",
        "CREATE INDEX CONCURRENTLY devices_client ON devices (client_id);",
        "CREATE TABLE IF NOT EXISTS audit (id bigint);\nCREATE INDEX audit_by_id ON audit(id);",
        "-- the old name is only dropped now: the text mentions DROP COLUMN in a comment\nSELECT 1;",
        "-- compatible: 0014 stopped reading last_error; 0015 is the contract step\n\
         ALTER TABLE outbox DROP COLUMN last_error;",
    ] {
        assert_eq!(breaking(sql), Vec::<String>::new(), "{sql}");
    }
}

#[test]
fn a_concurrent_build_is_alone_outside_a_transaction() {
    let alone =
        "-- no-transaction\n-- why\nCREATE INDEX CONCURRENTLY IF NOT EXISTS x ON devices (a);\n";
    assert_eq!(concurrent_build_runs_alone(alone), Ok(()));
    assert_eq!(
        concurrent_build_runs_alone("CREATE INDEX x ON t (a);"),
        Ok(())
    );
    for sql in [
        "CREATE INDEX CONCURRENTLY x ON devices (a);",
        "-- no-transaction\nCREATE INDEX CONCURRENTLY x ON devices (a);\nCREATE INDEX CONCURRENTLY y ON devices (b);",
    ] {
        assert!(concurrent_build_runs_alone(sql).is_err(), "{sql}");
    }
}
