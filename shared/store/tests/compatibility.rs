//! Rolling back keeps the newer schema (migrations/README.md), so the last release's binaries
//! must run on every migration made since. This test checks it in a real Postgres without a
//! second build. It migrates a database to the last release's schema and reads what that
//! release's code can depend on from the catalogs. Then it runs this build's `migrate` and reads
//! the catalogs again. Every difference the old code could trip on fails the test:
//!
//! - a column that is gone, retyped or newly NOT NULL;
//! - a new NOT NULL column without a default on an old table (old INSERTs fail);
//! - a constraint, unique index, function or trigger that is gone or changed;
//! - a constraint or trigger added to an old table;
//! - an enum label or a privilege that is gone.
//!
//! A contract step names what it may change: `-- compatible: outbox.last_error …`. The first
//! word after the colon is the object (a table, `table.column`, or a function's name).
//!
//! `migration_rules.rs` reads the files for the same rule. This test sees what Postgres made of
//! them.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

mod support;

use support::{migrations_dir, released};

use sqlx::{Connection, PgConnection};
use std::collections::{BTreeMap, BTreeSet};
use tidings_testkit::harness::TestDb;

/// What old code can depend on, keyed by object (`table.column`, `table:constraint`, …) with a
/// definition to compare.
#[derive(Debug, Default)]
struct Schema {
    tables: BTreeSet<String>,
    columns: BTreeMap<String, Column>,
    /// Constraints, unique indexes, functions, triggers, enum labels, privileges.
    objects: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Column {
    ty: String,
    not_null: bool,
    has_default: bool,
}

/// Relations of the public schema that are not partitions (a partition's columns, constraints
/// and triggers come from its parent, and partitions come and go with retention).
const TABLES: &str = "SELECT c.oid FROM pg_class c \
     WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v') \
     AND NOT c.relispartition";

async fn rows(conn: &mut PgConnection, sql: &str) -> Vec<(String, String)> {
    sqlx::query_as(sql)
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

async fn snapshot(conn: &mut PgConnection) -> Schema {
    let mut s = Schema::default();
    let tables: Vec<String> = sqlx::query_scalar(&format!(
        "SELECT relname::text FROM pg_class WHERE oid IN ({TABLES})"
    ))
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    s.tables = tables.into_iter().collect();
    let columns: Vec<(String, String, bool, bool)> = sqlx::query_as(&format!(
        "SELECT a.attrelid::regclass::text || '.' || a.attname, \
                format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atthasdef \
         FROM pg_attribute a WHERE a.attrelid IN ({TABLES}) AND a.attnum > 0 \
         AND NOT a.attisdropped"
    ))
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    for (key, ty, not_null, has_default) in columns {
        let column = Column {
            ty,
            not_null,
            has_default,
        };
        s.columns.insert(key, column);
    }
    let queries = [
        format!(
            "SELECT conrelid::regclass::text || ':constraint ' || conname, \
                    pg_get_constraintdef(oid) \
             FROM pg_constraint WHERE conrelid IN ({TABLES})"
        ),
        format!(
            "SELECT indrelid::regclass::text || ':unique index ' || indexrelid::regclass::text, \
                    pg_get_indexdef(indexrelid) \
             FROM pg_index WHERE indisunique AND indrelid IN ({TABLES})"
        ),
        "SELECT 'function ' || proname || '(' || pg_get_function_identity_arguments(oid) || ')', \
                pg_get_functiondef(oid) \
         FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
            .to_owned(),
        format!(
            "SELECT tgrelid::regclass::text || ':trigger ' || tgname, pg_get_triggerdef(oid) \
             FROM pg_trigger WHERE NOT tgisinternal AND tgrelid IN ({TABLES})"
        ),
        "SELECT 'enum ' || t.typname || ' ' || e.enumlabel, '' \
         FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid \
         WHERE t.typnamespace = 'public'::regnamespace"
            .to_owned(),
        format!(
            "SELECT c.relname || ':grant ' || a.privilege_type || ' to ' || r.rolname, '' \
             FROM pg_class c, aclexplode(c.relacl) a JOIN pg_roles r ON r.oid = a.grantee \
             WHERE c.oid IN ({TABLES}) OR (c.relnamespace = 'public'::regnamespace \
                                          AND c.relkind = 'S')"
        ),
        format!(
            "SELECT c.relname || '.' || att.attname || ':grant ' || a.privilege_type || ' to ' \
                    || r.rolname, '' \
             FROM pg_attribute att JOIN pg_class c ON c.oid = att.attrelid, \
                  aclexplode(att.attacl) a JOIN pg_roles r ON r.oid = a.grantee \
             WHERE c.oid IN ({TABLES}) AND NOT att.attisdropped"
        ),
        "SELECT 'function ' || p.proname || ':grant ' || a.privilege_type || ' to ' || r.rolname, \
                '' \
         FROM pg_proc p, aclexplode(p.proacl) a JOIN pg_roles r ON r.oid = a.grantee \
         WHERE p.pronamespace = 'public'::regnamespace AND a.grantee <> 0"
            .to_owned(),
    ];
    for sql in &queries {
        s.objects.extend(rows(conn, sql).await);
    }
    s
}

/// The table (or function name) an object key is about: `outbox.x` and `outbox:trigger t` are
/// about `outbox`, `function f(…)` about `f`.
fn table_of(key: &str) -> &str {
    let key = key.strip_prefix("function ").unwrap_or(key);
    key.split(['.', ':', '(']).next().unwrap_or(key)
}

/// What the old release's code could trip on, going from `old` to `new`; objects named in
/// `allowed` (`table`, `table.column` or a function's name) are let through.
fn breaks(old: &Schema, new: &Schema, allowed: &BTreeSet<String>) -> Vec<String> {
    let mut found: Vec<(&str, String)> = Vec::new();
    for (key, was) in &old.columns {
        match new.columns.get(key) {
            None => found.push((key, format!("column {key} is gone (dropped or renamed)"))),
            Some(now) if now.ty != was.ty => found.push((
                key,
                format!("column {key} changed type {} → {}", was.ty, now.ty),
            )),
            Some(now) if now.not_null && !was.not_null => {
                found.push((key, format!("column {key} became NOT NULL")))
            }
            Some(_) => {}
        }
    }
    for (key, now) in &new.columns {
        if !old.columns.contains_key(key)
            && old.tables.contains(table_of(key))
            && now.not_null
            && !now.has_default
        {
            found.push((
                key,
                format!("column {key} is new, NOT NULL and without a default: old INSERTs fail"),
            ));
        }
    }
    for (key, was) in &old.objects {
        match new.objects.get(key) {
            None => found.push((key, format!("{key} is gone"))),
            Some(now) if now != was => {
                found.push((key, format!("{key} changed:\n  {was}\n  {now}")))
            }
            Some(_) => {}
        }
    }
    for (key, def) in &new.objects {
        let tightens = key.contains(":constraint ") || key.contains(":trigger ");
        if tightens && !old.objects.contains_key(key) && old.tables.contains(table_of(key)) {
            found.push((
                key,
                format!("{key} is new on a table the old release writes: {def}"),
            ));
        }
    }
    let exempt = |key: &str| {
        let object = key.split(':').next().unwrap_or(key);
        allowed.iter().any(|a| object == a || table_of(key) == a)
    };
    found
        .into_iter()
        .filter(|(key, _)| !exempt(key))
        .map(|(_, message)| message)
        .collect()
}

/// The objects the unreleased migrations say they may change (`-- compatible: object …`).
fn allowed(after: i64) -> BTreeSet<String> {
    let mut allowed = BTreeSet::new();
    for entry in std::fs::read_dir(migrations_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(version) = name.split('_').next().and_then(|v| v.parse::<i64>().ok()) else {
            continue;
        };
        if version <= after {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            if let Some(rest) = line.trim_start().strip_prefix("-- compatible:")
                && let Some(object) = rest.split_whitespace().next()
            {
                allowed.insert(object.trim_end_matches([',', ';', ':']).to_owned());
            }
        }
    }
    allowed
}

/// A database at the last release's schema: its migrations and no later one.
async fn at_release(db: &TestDb) -> PgConnection {
    let released = released();
    let migrator = sqlx::migrate::Migrator {
        migrations: tidings_store::schema::MIGRATOR
            .iter()
            .filter(|m| m.version <= released)
            .cloned()
            .collect::<Vec<_>>()
            .into(),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    migrator.run(&mut conn).await.unwrap();
    conn
}

#[tokio::test]
async fn the_last_release_runs_on_the_schema_this_build_migrates_to() {
    let db = TestDb::empty().await.unwrap();
    let mut conn = at_release(&db).await;
    let old = snapshot(&mut conn).await;
    assert!(
        old.columns.contains_key("outbox.status") && old.objects.len() > 20,
        "the snapshot reads the schema: {old:?}"
    );
    let migrated = tidings_store::schema::migrate(&mut conn).await.unwrap();
    assert_eq!(migrated.version, tidings_store::schema::needed());
    let new = snapshot(&mut conn).await;
    let found = breaks(&old, &new, &allowed(released()));
    assert!(
        found.is_empty(),
        "a rollback to the last release (migration {}) would run its binaries on a schema they \
         cannot use (migrations/README.md):\n{}",
        released(),
        found.join("\n")
    );
}

/// The check fails on what breaks the old release and passes what only adds. Each statement
/// runs as an unreleased migration would, on top of the released schema, in a transaction that
/// is rolled back.
#[tokio::test]
async fn the_check_fails_on_a_migration_that_breaks_the_last_release() {
    let db = TestDb::empty().await.unwrap();
    let mut conn = at_release(&db).await;
    let old = snapshot(&mut conn).await;
    let breaking = [
        (
            "ALTER TABLE outbox RENAME COLUMN last_error TO error",
            "outbox.last_error",
        ),
        (
            "ALTER TABLE outbox DROP COLUMN last_error",
            "outbox.last_error",
        ),
        (
            "ALTER TABLE devices ALTER COLUMN time_zone TYPE varchar(64)",
            "devices.time_zone",
        ),
        (
            "ALTER TABLE outbox ALTER COLUMN last_error SET NOT NULL",
            "outbox.last_error",
        ),
        (
            "ALTER TABLE devices ADD COLUMN locale text NOT NULL",
            "devices.locale",
        ),
        (
            "ALTER TABLE devices ADD CONSTRAINT tz_short CHECK (length(time_zone) < 8) NOT VALID",
            "devices:constraint tz_short",
        ),
        (
            "CREATE OR REPLACE FUNCTION outbox_guard() RETURNS trigger LANGUAGE plpgsql \
             AS $$ BEGIN RETURN NEW; END $$",
            "function outbox_guard()",
        ),
        (
            "REVOKE INSERT ON outbox FROM tidings_api",
            "outbox:grant INSERT to tidings_api",
        ),
        ("DROP TABLE outbox_attempts", "outbox_attempts."),
    ];
    for (sql, names) in breaking {
        let mut tx = conn.begin().await.unwrap();
        sqlx::raw_sql(sql).execute(&mut *tx).await.unwrap();
        let found = breaks(&old, &snapshot(&mut tx).await, &BTreeSet::new());
        tx.rollback().await.unwrap();
        assert!(
            found.iter().any(|f| f.contains(names)),
            "{sql}: not found breaking ({found:?})"
        );
    }
    let adding = [
        "ALTER TABLE devices ADD COLUMN locale text",
        "ALTER TABLE devices ADD COLUMN locale text NOT NULL DEFAULT 'en'",
        "CREATE TABLE webhooks (id uuid PRIMARY KEY, url text NOT NULL)",
        "CREATE INDEX devices_by_zone ON devices (time_zone)",
        "CREATE FUNCTION tidings_answer() RETURNS int LANGUAGE sql AS 'SELECT 42'",
    ];
    for sql in adding {
        let mut tx = conn.begin().await.unwrap();
        sqlx::raw_sql(sql).execute(&mut *tx).await.unwrap();
        let found = breaks(&old, &snapshot(&mut tx).await, &BTreeSet::new());
        tx.rollback().await.unwrap();
        assert_eq!(found, Vec::<String>::new(), "{sql}");
    }
    // A contract step that names what it drops.
    let mut tx = conn.begin().await.unwrap();
    sqlx::raw_sql("ALTER TABLE outbox DROP COLUMN last_error")
        .execute(&mut *tx)
        .await
        .unwrap();
    let allowed = BTreeSet::from(["outbox.last_error".to_owned()]);
    let found = breaks(&old, &snapshot(&mut tx).await, &allowed);
    tx.rollback().await.unwrap();
    assert_eq!(found, Vec::<String>::new());
}
