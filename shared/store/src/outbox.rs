//! SQL of the outbox table that several statements share.
//!
//! Status sets are spelled out as literals rather than bound as parameters because the outbox's
//! partial indexes (`outbox_due`, `outbox_leases`) are chosen only when a statement's predicate
//! matches theirs literally. The statements checked at compile time (`query!`) take only string
//! literals, so they spell each set out and name it in a comment, `IN ('pending', 'retry')
//! /* status: due */`; the few statements built at run time use [`status_sql!`]. Tests read
//! every compile-checked statement from the query cache (`.sqlx/`) and check each set against
//! [`Status`](tidings_domain::outbox::Status), and each insert into the outbox against the
//! snapshot's columns.

/// The detection snapshot's columns, in the order every statement lists them (the database
/// guard, `outbox_guard()` in `migrations/0013_cancel_and_pause.sql`, keeps them immutable).
#[macro_export]
macro_rules! snapshot_columns {
    () => {
        "detected_at, detected_price, detected_currency, detected_in_stock, detected_paused, \
         detected_observed_at, baseline_price, baseline_reference, baseline_in_stock"
    };
}

/// A status or set of statuses as SQL: `status_sql!(due)` is `('pending', 'retry')`.
#[macro_export]
macro_rules! status_sql {
    (due) => {
        "('pending', 'retry')"
    };
    (sending) => {
        "'sending'"
    };
    (terminal) => {
        "('sent', 'dropped', 'failed')"
    };
    (undecided) => {
        "('pending', 'retry', 'sending')"
    };
    (replayable) => {
        "('dropped', 'failed')"
    };
    (cancellable) => {
        "('pending', 'retry')"
    };
    (out) => {
        "('sending', 'sent')"
    };
}

#[cfg(test)]
mod tests {
    use tidings_domain::outbox::Status;

    fn listed(sql: &str) -> Vec<Status> {
        sql.trim_matches(|c| c == '(' || c == ')')
            .split(',')
            .map(|s| {
                s.trim()
                    .trim_matches('\'')
                    .parse()
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect()
    }

    fn all(pred: impl Fn(Status) -> bool) -> Vec<Status> {
        Status::ALL.into_iter().filter(|s| pred(*s)).collect()
    }

    #[test]
    fn every_status_set_is_the_state_machines() {
        assert_eq!(listed(status_sql!(due)), all(Status::is_due_state));
        assert_eq!(listed(status_sql!(terminal)), all(Status::is_terminal));
        assert_eq!(listed(status_sql!(sending)), vec![Status::Sending]);
        // What a reader's cap counts: notifications that went out or are going.
        assert_eq!(
            listed(status_sql!(out)),
            all(|s| matches!(s, Status::Sending | Status::Sent))
        );
        assert_eq!(listed(status_sql!(undecided)), all(|s| !s.is_terminal()));
        // An operator replays what ended without being sent.
        assert_eq!(
            listed(status_sql!(replayable)),
            all(|s| s.is_terminal() && s != Status::Sent)
        );
        // An operator cancels what the state machine lets `Cancelled` end.
        let cancellable = all(|s| {
            let row = tidings_domain::outbox::Row {
                status: s,
                retry_count: 0,
                attempt: 0,
            };
            tidings_domain::outbox::apply(row, tidings_domain::outbox::Event::Cancelled, 5).is_ok()
        });
        assert_eq!(listed(status_sql!(cancellable)), cancellable);
    }

    #[test]
    fn the_snapshot_is_the_columns_the_guard_freezes() {
        // The latest function, and the latest trigger's condition for calling it (its fast path).
        let guard = last_migration_with(GUARD_FUNCTION);
        let fast_path = last_migration_with(GUARD_TRIGGER);
        for column in snapshot_columns!().split(',').map(str::trim) {
            for (name, migration) in [guard.clone(), fast_path.clone()] {
                for row in ["NEW", "OLD"] {
                    assert!(
                        migration.contains(&format!("{row}.{column}")),
                        "{column} is not frozen by {name}"
                    );
                }
            }
        }
    }

    /// What the migrations that define the guard's function, and its trigger, hold.
    const GUARD_FUNCTION: &str = "FUNCTION outbox_guard() RETURNS trigger";
    const GUARD_TRIGGER: &str = "TRIGGER outbox_guard BEFORE UPDATE";

    /// The last migration whose text holds `marker`, as (file name, text).
    fn last_migration_with(marker: &str) -> (String, String) {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations");
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "sql"))
            .collect();
        files.sort();
        files
            .into_iter()
            .rev()
            .map(|p| {
                (
                    p.display().to_string(),
                    std::fs::read_to_string(&p).unwrap(),
                )
            })
            .find(|(_, text)| text.contains(marker))
            .unwrap_or_else(|| panic!("no migration holds {marker}"))
    }

    /// The guard trigger's condition for calling `outbox_guard()` (its fast path) must hold every
    /// rule the function raises on, or an update breaking a rule the condition lacks would pass
    /// unchecked: each `IF` of the latest function is in the latest trigger's condition.
    #[test]
    fn the_guards_fast_path_checks_every_rule_of_its_function() {
        let fold = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
        let (fname, function) = last_migration_with(GUARD_FUNCTION);
        let (tname, trigger) = last_migration_with(GUARD_TRIGGER);
        let when = fold(&trigger[trigger.find("WHEN (").unwrap()..]);
        let from = &function[function.find("FUNCTION outbox_guard()").unwrap()..];
        // The body: between the first two `$$`.
        let body = fold(from.split("$$").nth(1).unwrap());
        let rules: Vec<&str> = body
            .split("IF ")
            .skip(1)
            .filter_map(|rest| rest.split(" THEN").next())
            .collect();
        assert!(
            rules.len() >= 6,
            "{fname}: only {} rules found",
            rules.len()
        );
        for rule in rules {
            assert!(
                when.contains(rule),
                "{tname}'s condition lacks a rule of {fname}: {rule}"
            );
        }
        assert!(
            when.starts_with("WHEN ( NEW.updated_at IS DISTINCT FROM now() OR"),
            "{when}"
        );
    }

    /// Every statement `query!` checked, from the query cache.
    fn cached_statements() -> Vec<String> {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/.sqlx");
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{dir}: {e}")) {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
            found.push(json["query"].as_str().unwrap().to_owned());
        }
        assert!(found.len() > 50, "{} statements in {dir}", found.len());
        found
    }

    /// The statuses quoted in `sql` (`'pending'`, `('pending', 'retry')`), which must be all of
    /// it but whitespace.
    fn quoted(sql: &str) -> Vec<Status> {
        listed(sql.trim())
    }

    #[test]
    fn every_status_set_in_a_checked_statement_is_the_state_machines() {
        let named = |name: &str| match name {
            "due" => status_sql!(due),
            "sending" => status_sql!(sending),
            "terminal" => status_sql!(terminal),
            "undecided" => status_sql!(undecided),
            "replayable" => status_sql!(replayable),
            "cancellable" => status_sql!(cancellable),
            "out" => status_sql!(out),
            other => panic!("no status set is named {other}"),
        };
        let mut marked = 0;
        for sql in cached_statements() {
            let mut rest = sql.as_str();
            while let Some(at) = rest.find("/* status: ") {
                let (before, after) = rest.split_at(at);
                let name = &after["/* status: ".len()..after.find(" */").unwrap()];
                // The set is the literal just before the comment, after `IN`, `=` or `SELECT`.
                let start = before
                    .rfind(" IN ")
                    .map(|i| i + 4)
                    .into_iter()
                    .chain(before.rfind("= ").map(|i| i + 2))
                    .chain(before.rfind("SELECT ").map(|i| i + 7))
                    .max()
                    .unwrap();
                assert_eq!(quoted(&before[start..]), quoted(named(name)), "{sql}");
                marked += 1;
                rest = &after[1..];
            }
            // A set without its name could drift from the state machine unnoticed.
            let sets = sql.matches("status IN (").count();
            let named_sets = sql.matches(") /* status: ").count();
            assert_eq!(sets, named_sets, "a status set without its name in {sql}");
            // Single statuses compared or set must at least be ones the state machine has.
            for part in sql.split("status = '").skip(1) {
                let name = &part[..part.find('\'').unwrap()];
                assert!(name.parse::<Status>().is_ok(), "{name} in {sql}");
            }
        }
        assert!(marked >= 10, "{marked} named status sets");
    }

    #[test]
    fn every_checked_insert_into_the_outbox_copies_the_whole_snapshot() {
        let mut inserts = 0;
        for sql in cached_statements() {
            if sql.contains("INSERT INTO outbox (") {
                inserts += 1;
                for column in snapshot_columns!().split(',').map(str::trim) {
                    assert!(
                        sql.matches(column).count() >= 2,
                        "{column} is not copied by {sql}"
                    );
                }
            }
        }
        assert!(inserts >= 2, "{inserts} inserts into the outbox");
    }
}
