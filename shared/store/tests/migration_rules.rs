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
    code.split(';')
        .map(|s| {
            s.split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .to_uppercase()
        })
        .filter(|s| {
            BREAKING.iter().any(|b| s.contains(b))
                || (s.contains("ALTER COLUMN") && s.contains(" TYPE "))
                || (s.contains("ADD COLUMN") && s.contains("NOT NULL") && !s.contains("DEFAULT"))
        })
        .collect()
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
        let found = breaking(&std::fs::read_to_string(&path).unwrap());
        assert!(
            found.is_empty(),
            "{name} would break the release before it on a rollback (migrations/README.md): \
             {found:?}; split it (expand now, contract a release later) or say why it is safe \
             in a `-- compatible:` comment"
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
        "-- the old name is only dropped now: the text mentions DROP COLUMN in a comment\nSELECT 1;",
        "-- compatible: 0014 stopped reading last_error; 0015 is the contract step\n\
         ALTER TABLE outbox DROP COLUMN last_error;",
    ] {
        assert_eq!(breaking(sql), Vec::<String>::new(), "{sql}");
    }
}
