//! SQL of the outbox table that several statements share, written once.
//!
//! Statements are `&'static str` built with `concat!`, so these pieces are macros. Status sets
//! are spelled out as literals rather than bound as parameters because the outbox's partial
//! indexes (`outbox_due`, `outbox_leases`) are chosen only when a statement's predicate matches
//! theirs literally; a test checks every set against [`Status`](tidings_domain::outbox::Status).

/// The detection snapshot's columns, in the order every statement lists them (the database
/// guard in `migrations/0001_init.sql` keeps them immutable).
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
        let migration = include_str!("../../../migrations/0001_init.sql");
        for column in snapshot_columns!().split(',').map(str::trim) {
            assert!(
                migration.contains(&format!("NEW.{column}")),
                "{column} is not frozen by outbox_guard"
            );
        }
    }
}
