//! The schema keeps the promises docs/design.md makes at the database level. Its tests write
//! raw SQL on purpose: each makes (or tries) a state or an edit the code never would, to see the
//! database refuse it or keep its promise anyway.

// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

use chrono::{NaiveDate, TimeZone, Utc};
use tidings_domain::messages::EnqueueRequest;
use tidings_domain::outbox::{self, Event, Status};
use tidings_domain::trigger::Trigger;
use tidings_domain::{OutboxId, WatchId};
use tidings_store::transition::{self, Change};
use tidings_testkit::fixtures::{self, Device, Inserted};
use tidings_testkit::harness::TestDb;
use uuid::Uuid;

const BELOW_1200: Trigger = Trigger::PriceBelow { threshold: 1200 };

async fn watched(db: &TestDb, tz: &str) -> (Device, WatchId) {
    let device = fixtures::device(&db.pool, tz).await.unwrap();
    let watch = fixtures::watch(&db.pool, device.id, "SKU-1", &[BELOW_1200], Some(1500))
        .await
        .unwrap();
    (device, watch)
}

/// A database with one watch and one pending outbox row for it.
async fn one_row(db: &TestDb) -> (WatchId, OutboxId) {
    let (device, watch) = watched(db, "UTC").await;
    let at = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();
    let req = fixtures::enqueue_request(&device, watch, BELOW_1200, 1100, at);
    let Inserted::New(id) = fixtures::insert_outbox(&db.pool, &req).await.unwrap() else {
        panic!("expected a new row");
    };
    (watch, id)
}

/// A watch's outbox rows by dedup day: (dedup day, detected price).
async fn rows_of(db: &TestDb, watch: WatchId) -> Vec<(NaiveDate, i64)> {
    let sql = "SELECT dedup_day, detected_price FROM outbox WHERE watch_id = $1 ORDER BY 1";
    sqlx::query_as(sql)
        .bind(watch)
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_same_dedup_key_twice_is_one_row_and_a_reported_duplicate() {
    let db = TestDb::new().await.unwrap();
    let (device, watch) = watched(&db, "UTC").await;
    let at = Utc.with_ymd_and_hms(2026, 11, 30, 9, 0, 0).unwrap();
    let first = fixtures::enqueue_request(&device, watch, BELOW_1200, 1100, at);
    // A later scan the same day sees another price; the key, not the content, decides.
    let again = fixtures::enqueue_request(
        &device,
        watch,
        BELOW_1200,
        1050,
        at + chrono::Duration::hours(3),
    );

    assert!(matches!(
        fixtures::insert_outbox(&db.pool, &first).await.unwrap(),
        Inserted::New(_)
    ));
    assert_eq!(
        fixtures::insert_outbox(&db.pool, &again).await.unwrap(),
        Inserted::Duplicate
    );
    let rows = rows_of(&db, watch).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1, 1100, "the first detection's snapshot is kept");
}

#[tokio::test]
async fn the_next_days_detection_is_a_new_row() {
    let db = TestDb::new().await.unwrap();
    let (device, watch) = watched(&db, "UTC").await;
    let today = Utc.with_ymd_and_hms(2026, 11, 30, 23, 59, 0).unwrap();
    let tomorrow = Utc.with_ymd_and_hms(2026, 12, 1, 0, 1, 0).unwrap();
    for at in [today, tomorrow] {
        let req = fixtures::enqueue_request(&device, watch, BELOW_1200, 1100, at);
        assert!(matches!(
            fixtures::insert_outbox(&db.pool, &req).await.unwrap(),
            Inserted::New(_)
        ));
    }
    assert_eq!(rows_of(&db, watch).await.len(), 2);
}

#[tokio::test]
async fn the_devices_time_zone_moves_the_day_boundary() {
    let db = TestDb::new().await.unwrap();
    // 22:30 and 23:30 UTC on Nov 30 are the same day in UTC but straddle midnight in Berlin.
    let before = Utc.with_ymd_and_hms(2026, 11, 30, 22, 30, 0).unwrap();
    let after = Utc.with_ymd_and_hms(2026, 11, 30, 23, 30, 0).unwrap();

    let (utc_device, utc_watch) = watched(&db, "UTC").await;
    let (berlin_device, berlin_watch) = watched(&db, "Europe/Berlin").await;
    for at in [before, after] {
        for (device, watch) in [(&utc_device, utc_watch), (&berlin_device, berlin_watch)] {
            let req = fixtures::enqueue_request(device, watch, BELOW_1200, 1100, at);
            fixtures::insert_outbox(&db.pool, &req).await.unwrap();
        }
    }
    assert_eq!(rows_of(&db, utc_watch).await.len(), 1);
    let days: Vec<String> = rows_of(&db, berlin_watch)
        .await
        .iter()
        .map(|(day, _)| day.to_string())
        .collect();
    assert_eq!(days, ["2026-11-30", "2026-12-01"]);
}

/// How an update treats `updated_at`: the services' statements stamp it themselves, which lets
/// the guard trigger skip its function when no rule is broken (migration 0028); any other
/// statement leaves it to the function. The guard must hold either way.
#[derive(Clone, Copy, Debug)]
enum Stamp {
    Left,
    Own,
}

impl Stamp {
    const BOTH: [Stamp; 2] = [Stamp::Left, Stamp::Own];

    /// What the statement adds to its `SET` list.
    fn set(self) -> &'static str {
        match self {
            Stamp::Left => "",
            Stamp::Own => ", updated_at = now()",
        }
    }
}

/// Moves a row to `to`, filling the columns that state requires. Errors are the database's.
async fn set_status(db: &TestDb, id: OutboxId, to: Status) -> Result<(), sqlx::Error> {
    set_status_stamped(db, id, to, Stamp::Left).await
}

async fn set_status_stamped(
    db: &TestDb,
    id: OutboxId,
    to: Status,
    stamp: Stamp,
) -> Result<(), sqlx::Error> {
    let sql = format!(
        "UPDATE outbox SET status = $2,
             reason = CASE WHEN $2 IN ('dropped', 'failed') THEN 'test' END,
             finished_at = CASE WHEN $2 IN ('sent', 'dropped', 'failed') THEN now() END,
             lease_until = CASE WHEN $2 = 'sending' THEN now() + interval '1 minute' END,
             deadline = CASE WHEN $2 = 'sending' THEN now() + interval '30 seconds' END{}
         WHERE id = $1",
        stamp.set()
    );
    sqlx::query(&sql)
        .bind(id)
        .bind(to.as_str())
        .execute(&db.pool)
        .await
        .map(|_| ())
}

/// The SQLSTATE of a refused statement (`23514`: the guard's `check_violation`).
fn code(e: &sqlx::Error) -> Option<String> {
    e.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
}

/// A legal route from pending to each state, to set up a row in that state.
fn route_to(s: Status) -> &'static [Status] {
    match s {
        Status::Pending => &[],
        Status::Retry => &[Status::Retry],
        Status::Sending => &[Status::Sending],
        Status::Sent => &[Status::Sending, Status::Sent],
        Status::Dropped => &[Status::Dropped],
        Status::Failed => &[Status::Failed],
    }
}

#[tokio::test]
async fn the_database_allows_exactly_the_state_machines_transitions() {
    let db = TestDb::new().await.unwrap();
    let (device, watch) = watched(&db, "UTC").await;
    let start = Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap();
    let mut day = 0;
    for stamp in Stamp::BOTH {
        for from in Status::ALL {
            for to in Status::ALL {
                day += 1;
                let at = start + chrono::Duration::days(day);
                let req = fixtures::enqueue_request(&device, watch, BELOW_1200, 1100, at);
                let Inserted::New(id) = fixtures::insert_outbox(&db.pool, &req).await.unwrap()
                else {
                    panic!("expected a new row");
                };
                for step in route_to(from) {
                    set_status(&db, id, *step).await.unwrap();
                }
                let result = set_status_stamped(&db, id, to, stamp).await;
                // Same-status updates are how a claim moves a due row's lease.
                let allowed = from.can_move_to(to) || (from == to && from.is_due_state());
                match result {
                    Ok(()) => assert!(
                        allowed,
                        "database accepted illegal {from} -> {to} ({stamp:?})"
                    ),
                    Err(e) => {
                        assert!(
                            !allowed,
                            "database refused legal {from} -> {to} ({stamp:?}): {e}"
                        );
                        assert_eq!(code(&e).as_deref(), Some("23514"), "{from} -> {to}: {e}");
                    }
                }
            }
        }
    }
}

/// A change of each frozen column, as SQL: the detection snapshot and the row's identity.
fn changed(column: &str) -> &'static str {
    match column {
        "watch_id" | "device_id" => "gen_random_uuid()",
        "trigger" => "trigger || '-x'",
        "channel" => "CASE WHEN channel = 'webhook' THEN 'email' ELSE 'webhook' END",
        "dedup_day" => "dedup_day + 1",
        "detected_at" | "detected_observed_at" => "now() - interval '1 day'",
        "detected_price" => "detected_price + 1",
        "detected_currency" => "detected_currency || 'X'",
        "detected_in_stock" => "NOT detected_in_stock",
        "detected_paused" => "NOT detected_paused",
        "baseline_price" => "coalesce(baseline_price, 0) + 1",
        "baseline_reference" => "coalesce(baseline_reference, 0) + 1",
        "baseline_in_stock" => "NOT coalesce(baseline_in_stock, false)",
        other => panic!("no change written for frozen column {other}"),
    }
}

/// The guard's fast path (migration 0028) skips its function only for an update that breaks
/// none of its rules: an update stamping its own time is refused for each rule as one that does
/// not, and a row's `updated_at` is the time of its last change either way.
#[tokio::test]
async fn an_update_that_stamps_its_own_time_meets_every_rule_of_the_guard() {
    let db = TestDb::new().await.unwrap();
    let (_, id) = one_row(&db).await;
    let update = |set: String| {
        let pool = db.pool.clone();
        async move {
            let sql = format!("UPDATE outbox SET {set} WHERE id = $1");
            sqlx::query(&sql).bind(id).execute(&pool).await.map(|_| ())
        }
    };
    let refused = |r: Result<(), sqlx::Error>, what: &str| match r {
        Ok(()) => panic!("{what} was accepted"),
        Err(e) => assert_eq!(code(&e).as_deref(), Some("23514"), "{what}: {e}"),
    };
    // Each refusal below breaks one rule only: a due row may be updated in place, and its
    // counters and mark are up, so lowering one is the only thing wrong with the update. Each
    // column set to its own value (the same statement otherwise) is accepted.
    let stamp = Stamp::Own.set();
    let due = "status = 'retry', attempt = 2, retry_count = 1, maybe_delivered = true";
    update(format!("{due}{stamp}")).await.unwrap();
    let identity = ["watch_id", "device_id", "trigger", "channel", "dedup_day"];
    let snapshot = tidings_store::snapshot_columns!().split(',').map(str::trim);
    let lowered = [
        ("attempt", "1"),
        ("retry_count", "0"),
        ("maybe_delivered", "false"),
    ];
    for stamp in Stamp::BOTH {
        let s = stamp.set();
        let frozen = identity.into_iter().chain(snapshot.clone());
        let changes = frozen.map(|c| (c, changed(c))).chain(lowered);
        for (column, value) in changes {
            update(format!("{column} = {column}{s}")).await.unwrap();
            let set = format!("{column} = {value}{s}");
            refused(
                update(set).await,
                &format!("{column} = {value} ({stamp:?})"),
            );
        }
    }
    // A row in flight may end `dropped`, but not as an operator's cancel.
    let in_flight = "status = 'sending', lease_until = now(), deadline = now()";
    update(format!("{in_flight}{stamp}")).await.unwrap();
    for stamp in Stamp::BOTH {
        let s = stamp.set();
        let cancel = format!(
            "status = 'dropped', reason = 'cancelled', finished_at = now(), lease_until = NULL{s}"
        );
        refused(
            update(cancel).await,
            &format!("a row in flight cancelled ({stamp:?})"),
        );
    }
    let updated_at = || {
        let pool = db.pool.clone();
        async move {
            let sql = "SELECT updated_at FROM outbox WHERE id = $1";
            let (at,): (chrono::DateTime<Utc>,) =
                sqlx::query_as(sql).bind(id).fetch_one(&pool).await.unwrap();
            at
        }
    };
    // A statement's own older time is replaced by the change's: the function still stamps it.
    update("status = 'retry', lease_until = NULL, updated_at = '2000-01-01'".into())
        .await
        .unwrap();
    let retried = updated_at().await;
    assert!(
        retried > Utc::now() - chrono::Duration::minutes(1),
        "kept a time not its own: {retried}"
    );
    update(format!("status = 'sent', finished_at = now(){stamp}"))
        .await
        .unwrap();
    assert!(
        updated_at().await > retried,
        "a stamped change did not move updated_at"
    );
    refused(
        update(format!("last_error = 'edited'{stamp}")).await,
        "a stamped edit of a terminal row",
    );
}

#[tokio::test]
async fn terminal_rows_and_detection_snapshots_never_change_and_rows_are_never_deleted() {
    let db = TestDb::new().await.unwrap();
    let (watch, id) = one_row(&db).await;

    let rewrite = sqlx::query("UPDATE outbox SET detected_price = 1 WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await;
    assert!(rewrite.is_err(), "the detection snapshot was rewritten");

    set_status(&db, id, Status::Dropped).await.unwrap();
    let edit = sqlx::query("UPDATE outbox SET last_error = 'edited' WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await;
    assert!(edit.is_err(), "a terminal row was edited");

    let delete = sqlx::query("DELETE FROM outbox WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await;
    assert!(delete.is_err(), "an outbox row was deleted");
    assert_eq!(rows_of(&db, watch).await.len(), 1);
}

#[tokio::test]
async fn a_dropped_or_failed_row_must_carry_its_reason() {
    let db = TestDb::new().await.unwrap();
    let (_, id) = one_row(&db).await;
    let no_reason =
        sqlx::query("UPDATE outbox SET status = 'dropped', finished_at = now() WHERE id = $1")
            .bind(id)
            .execute(&db.pool)
            .await;
    assert!(no_reason.is_err(), "dropped without a reason was accepted");
}

/// Copies `of` as a replay that names `replay_of` (the api's replay names `of` itself).
async fn insert_replay(db: &TestDb, of: OutboxId, replay_of: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO outbox (id, watch_id, device_id, trigger, channel, dedup_day, detected_at,
                             detected_price, detected_currency, detected_in_stock, detected_paused,
                             detected_observed_at, replay_of)
         SELECT $1, watch_id, device_id, trigger, channel, dedup_day, detected_at, detected_price,
                detected_currency, detected_in_stock, detected_paused, detected_observed_at, $2
         FROM outbox WHERE id = $3",
    )
    .bind(OutboxId::new())
    .bind(replay_of)
    .bind(of)
    .execute(&db.pool)
    .await
    .map(drop)
}

fn foreign_key_violation(e: &sqlx::Error) -> bool {
    code(e).as_deref() == Some("23503")
}

#[tokio::test]
async fn a_replay_must_name_an_existing_row_without_a_foreign_key_on_every_insert() {
    let db = TestDb::new().await.unwrap();
    let (watch, id) = one_row(&db).await;

    let dangling = insert_replay(&db, id, Uuid::now_v7()).await;
    assert!(
        dangling.as_ref().is_err_and(foreign_key_violation),
        "a replay of a row that does not exist was accepted: {dangling:?}"
    );
    insert_replay(&db, id, id.0).await.unwrap();
    let moved = sqlx::query("UPDATE outbox SET replay_of = $1 WHERE replay_of = $2")
        .bind(Uuid::now_v7())
        .bind(id.0)
        .execute(&db.pool)
        .await;
    assert!(
        moved.as_ref().is_err_and(foreign_key_violation),
        "a replay was pointed at a row that does not exist: {moved:?}"
    );
    assert_eq!(rows_of(&db, watch).await.len(), 2);

    // The check is a trigger that runs only for replays: a foreign key would queue a check event
    // for every ingested row (9 % of ingest's Postgres work, migration 0006).
    let foreign_keys: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_constraint WHERE conrelid = 'outbox'::regclass AND contype = 'f'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(foreign_keys, 0);
}

#[tokio::test]
async fn readiness_needs_the_schema_this_build_carries() {
    use tidings_store::schema::{self, SchemaError};
    let ready = |db: &TestDb| {
        let check = tidings_store::readiness(db.pool.clone());
        async move { check().await }
    };

    let empty = TestDb::empty().await.unwrap();
    let err = schema::check(&empty.pool).await.unwrap_err();
    assert!(
        matches!(err, SchemaError::Missing { needed } if needed == schema::needed()),
        "{err}"
    );
    let said = ready(&empty).await.unwrap_err();
    assert!(said.contains("run `tidings-api migrate`"), "{said}");

    // A database one migration behind this build (the Job of the new release has not run).
    let db = TestDb::new().await.unwrap();
    assert_eq!(schema::check(&db.pool).await.unwrap(), schema::needed());
    assert_eq!(ready(&db).await, Ok(()));
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
        .bind(schema::needed())
        .execute(&db.pool)
        .await
        .unwrap();
    let err = schema::check(&db.pool).await.unwrap_err();
    assert!(
        matches!(err, SchemaError::Behind { found, needed } if found < needed),
        "{err}"
    );

    // The api's gate opens once migrated, and stays open.
    let gate = schema::Gate::new(empty.pool.clone());
    assert!(gate.pass().await.is_err());
    schema::MIGRATOR.run(&empty.pool).await.unwrap();
    gate.pass().await.unwrap();
    assert_eq!(ready(&empty).await, Ok(()));
}

/// Runs `sql` as `role` (in a transaction that is rolled back); the error code if refused.
async fn as_role(db: &TestDb, role: &str, sql: &str) -> Result<(), String> {
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query(&format!("SET LOCAL ROLE {role}"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let done = sqlx::query(sql).execute(&mut *tx).await;
    tx.rollback().await.unwrap();
    done.map(|_| ()).map_err(|e| match e {
        sqlx::Error::Database(d) => d.code().unwrap_or_default().into_owned(),
        other => other.to_string(),
    })
}

#[tokio::test]
async fn each_service_role_may_do_its_job_and_is_refused_the_rest() {
    let db = TestDb::new().await.unwrap();
    let (_, outbox) = one_row(&db).await;
    let move_row = format!(
        "UPDATE outbox SET next_attempt_at = now() WHERE id = '{}'",
        outbox.0
    );
    let move_row = move_row.as_str();
    let cancel = format!(
        "UPDATE outbox SET status = 'dropped', reason = 'cancelled', finished_at = now(),
                last_error = 'cancelled', claimed_until = NULL WHERE id = '{}'",
        outbox.0
    );
    let cancel = cancel.as_str();
    let attempt = format!(
        "INSERT INTO outbox_attempts (outbox_id, dedup_day, attempt, outcome)
         SELECT id, dedup_day, 1, 'delivered' FROM outbox WHERE id = '{}'",
        outbox.0
    );
    let attempt = attempt.as_str();
    let device_columns = "SELECT id, time_zone, removed_at FROM devices";
    let tokens = "SELECT token_hash FROM devices";
    let allowed = [
        (
            "tidings_api",
            vec![
                tokens,
                "UPDATE watches SET paused = paused",
                "SELECT * FROM outbox",
                "SELECT * FROM outbox_attempts",
                cancel,
                "UPDATE devices SET paused_at = now()",
                // Its one way to move a row's next attempt: held rows, due now.
                "SELECT tidings_release_held(gen_random_uuid(), NULL)",
            ],
        ),
        (
            "tidings_dispatcher",
            vec![
                move_row,
                attempt,
                "SELECT paused_at FROM devices",
                "SELECT * FROM push_subscriptions",
                "UPDATE push_subscriptions SET active = false, deactivated_at = now(), deactivation_reason = 'gone'",
                device_columns,
            ],
        ),
        (
            "tidings_detector",
            vec![
                "UPDATE watches SET last_in_stock = true, reference_price = 1",
                "SELECT * FROM baselines",
                device_columns,
            ],
        ),
    ];
    // 42501 (insufficient_privilege). The api reads the history and attempts, inserts replays,
    // cancels a due row (status, reason, error, end time: nothing else) and makes held rows due; the dispatcher never sees a token hash nor changes a device or a watch, and
    // of a subscription only marks it gone; the detector enqueues only through NATS (no outbox,
    // no subscriptions, no tokens) and of a watch records only what a scan saw.
    let refused = [
        (
            "tidings_api",
            vec![
                move_row,
                attempt,
                "UPDATE outbox SET attempt = attempt + 1",
                "DELETE FROM devices",
                "SELECT * FROM baselines",
            ],
        ),
        (
            "tidings_dispatcher",
            vec![
                tokens,
                "UPDATE watches SET paused = true",
                "UPDATE devices SET time_zone = 'UTC'",
                "UPDATE push_subscriptions SET endpoint = 'https://attacker.example/'",
            ],
        ),
        (
            "tidings_detector",
            vec![
                "SELECT * FROM outbox",
                "SELECT * FROM outbox_attempts",
                move_row,
                "SELECT endpoint FROM push_subscriptions",
                tokens,
                "UPDATE baselines SET price = price",
                "UPDATE watches SET paused = true",
                "SELECT tidings_release_held(gen_random_uuid(), NULL)",
            ],
        ),
    ];
    for (role, statements) in allowed {
        for sql in statements {
            assert_eq!(as_role(&db, role, sql).await, Ok(()), "{role}: {sql}");
        }
    }
    for (role, statements) in refused {
        for sql in statements {
            let refused = as_role(&db, role, sql).await;
            assert_eq!(refused, Err("42501".to_owned()), "{role}: {sql}");
        }
    }
}

/// An outbox written under the schema before partitioning (migrations up to 0009) keeps every
/// row, column for column, when 0010 partitions it by week; its dedup key and its
/// one-replay-per-row rule hold after.
/// Inserts `req` as ingest did on the schema before 0010 (today's insert names columns added
/// since).
async fn insert_before_0010(db: &TestDb, req: &EnqueueRequest) {
    let d = &req.detected;
    sqlx::query(
        "INSERT INTO outbox (id, watch_id, device_id, trigger, channel, dedup_day, detected_at,
                             detected_price, detected_currency, detected_in_stock, detected_paused,
                             detected_observed_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(OutboxId::new())
    .bind(req.watch_id)
    .bind(req.device_id)
    .bind(req.trigger.key())
    .bind(req.channel.as_str())
    .bind(req.dedup_day)
    .bind(req.detected_at)
    .bind(d.price)
    .bind(&d.currency)
    .bind(d.in_stock)
    .bind(d.paused)
    .bind(d.observed_at)
    .execute(&db.pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn an_unpartitioned_outbox_is_partitioned_with_every_row_and_its_keys() {
    let db = TestDb::empty().await.unwrap();
    let before = std::env::temp_dir().join(format!("tidings-migrations-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&before).unwrap();
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.as_str() < "0010" {
            std::fs::copy(&path, before.join(&name)).unwrap();
        }
    }
    sqlx::migrate::Migrator::new(before.as_path())
        .await
        .unwrap()
        .run(&db.pool)
        .await
        .unwrap();
    std::fs::remove_dir_all(&before).unwrap();

    // Rows over several months, some decided, one replayed.
    let (device, watch) = watched(&db, "Europe/Paris").await;
    let now = Utc::now();
    let mut ids = Vec::new();
    for back in [0, 1, 6, 13, 45, 120] {
        let req = fixtures::enqueue_request(
            &device,
            watch,
            BELOW_1200,
            1000 + back,
            now - chrono::Duration::days(back),
        );
        insert_before_0010(&db, &req).await;
        ids.push(req);
    }
    sqlx::query(
        "UPDATE outbox SET status = 'dropped', reason = 'condition_lost', finished_at = now()
         WHERE detected_price > 1010",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let replayed: OutboxId =
        sqlx::query_scalar("SELECT id FROM outbox WHERE detected_price = 1045")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    insert_replay(&db, replayed, replayed.0).await.unwrap();
    let all = "SELECT to_jsonb(o) FROM outbox o ORDER BY id";
    let old: Vec<serde_json::Value> = sqlx::query_scalar(all).fetch_all(&db.pool).await.unwrap();
    assert_eq!(old.len(), 7);

    tidings_store::schema::MIGRATOR.run(&db.pool).await.unwrap();

    let kind: String =
        sqlx::query_scalar("SELECT relkind::text FROM pg_class WHERE relname = 'outbox'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(kind, "p", "the outbox is partitioned");
    let mut new: Vec<serde_json::Value> =
        sqlx::query_scalar(all).fetch_all(&db.pool).await.unwrap();
    // Columns later migrations add, empty on rows written before them (0012: the ending attempt;
    // 0016: the row a withdrawal withdraws; 0026: why a row waited for its reader).
    for row in &mut new {
        let row = row.as_object_mut().unwrap();
        for added in [
            "attempt_outcome",
            "attempt_started_at",
            "attempt_push_host",
            "attempt_ms",
            "withdraws",
            "held",
            "digest_of",
        ] {
            assert_eq!(row.remove(added), Some(serde_json::Value::Null), "{added}");
        }
    }
    assert_eq!(new, old, "every row, column for column");
    // Each row sits in its week's partition.
    let misplaced = db
        .count(
            "SELECT count(*) FROM outbox o
             WHERE o.tableoid::regclass::text <> 'outbox_' || to_char(date_trunc('week', o.dedup_day), 'YYYYMMDD')",
        )
        .await;
    assert_eq!(misplaced, 0);
    // The dedup key refuses a detection of a migrated day; a second replay of the row is refused.
    assert_eq!(
        tidings_store::enqueue::insert(&db.pool, &[(&ids[4], None)])
            .await
            .unwrap(),
        0
    );
    let second = insert_replay(&db, replayed, replayed.0).await.unwrap_err();
    assert!(
        matches!(&second, sqlx::Error::Database(d) if d.code().as_deref() == Some("23505")),
        "{second}"
    );
    // The rules that came with the table: terminal rows never change, rows are never deleted.
    assert!(
        sqlx::query("UPDATE outbox SET status = 'pending' WHERE detected_price = 1120")
            .execute(&db.pool)
            .await
            .is_err()
    );
    assert!(
        sqlx::query("DELETE FROM outbox")
            .execute(&db.pool)
            .await
            .is_err()
    );
}

/// A rollback: a newer release applied a migration this build does not carry. sqlx's own
/// migrator refuses that database (VersionMissing), which crash-looped the previous release's
/// migrate step; `schema::migrate` leaves the newer migration, says which it is, and the build
/// is ready on that schema.
#[tokio::test]
async fn migrate_tolerates_a_migration_newer_than_the_build() {
    use tidings_store::schema;
    let db = TestDb::empty().await.unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    let first = schema::migrate(&mut conn).await.unwrap();
    assert_eq!(first.version, schema::needed());
    assert!(first.newer.is_empty());

    let future = schema::needed() + 1;
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, 'from a newer release', true, '\\x00'::bytea, 1)",
    )
    .bind(future)
    .execute(&mut *conn)
    .await
    .unwrap();
    let strict = schema::MIGRATOR.run(&mut *conn).await.unwrap_err();
    assert!(
        matches!(strict, sqlx::migrate::MigrateError::VersionMissing(v) if v == future),
        "{strict}"
    );

    let again = schema::migrate(&mut conn).await.unwrap();
    assert_eq!(again.version, schema::needed());
    assert_eq!(again.newer, vec![future]);
    assert_eq!(schema::check(&db.pool).await.unwrap(), future);
}

/// States decode as `Status` at the boundary: every one the schema allows, and an unknown one
/// is an error, never a fallback.
#[tokio::test]
async fn outbox_states_decode_as_enums_and_an_unknown_one_is_an_error() {
    let db = TestDb::new().await.unwrap();
    for s in Status::ALL {
        let back: Status = sqlx::query_scalar("SELECT $1::text")
            .bind(s.as_str())
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(back, s);
    }
    let unknown = sqlx::query_scalar::<_, Status>("SELECT 'carrier_pigeon'::text")
        .fetch_one(&db.pool)
        .await;
    assert!(unknown.is_err(), "{unknown:?}");
}

/// A migration that needs a lock a long transaction holds waits at most its lock timeout, and
/// queries on that table go on meanwhile; once the transaction ends, `migrate` finishes (#54).
/// Regression: with no lock timeout, 0020's `ALTER TABLE push_subscriptions`, queued behind the
/// transaction, blocked every later query on the table for as long as it waited.
#[tokio::test]
async fn migrate_waits_out_a_long_transaction_without_stalling_its_table() {
    use std::time::{Duration, Instant};
    use tidings_store::schema::{self, Limits};
    let db = TestDb::empty().await.unwrap();
    let before_0020 = sqlx::migrate::Migrator {
        migrations: (schema::MIGRATOR.iter())
            .filter(|m| m.version < 20)
            .cloned()
            .collect::<Vec<_>>()
            .into(),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    before_0020.run(&db.pool).await.unwrap();
    // A long transaction that read push_subscriptions: its lock outlives the read.
    let mut long = db.pool.begin().await.unwrap();
    sqlx::query("SELECT count(*) FROM push_subscriptions")
        .execute(&mut *long)
        .await
        .unwrap();
    let limits = Limits {
        lock_timeout: Duration::from_millis(300),
        statement_timeout: Duration::from_secs(60),
        deadline: Duration::from_secs(60),
    };
    let mut conn = db.pool.acquire().await.unwrap();
    // Traffic on the table goes on while migrate waits and tries again; then the transaction
    // ends.
    let traffic = async {
        let started = Instant::now();
        let mut slowest = Duration::ZERO;
        while started.elapsed() < Duration::from_secs(4) {
            let query = Instant::now();
            let read = tokio::time::timeout(
                Duration::from_secs(2),
                sqlx::query("SELECT count(*) FROM push_subscriptions").execute(&db.pool),
            )
            .await;
            assert!(
                read.is_ok(),
                "a query on the table waited behind the migration"
            );
            slowest = slowest.max(query.elapsed());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            schema::check(&db.pool).await.is_err(),
            "0020 applied through the lock"
        );
        long.commit().await.unwrap();
        slowest
    };
    let (migrated, slowest) = tokio::join!(schema::migrate_within(&mut conn, limits), traffic);
    assert!(
        slowest < Duration::from_secs(1),
        "slowest query {slowest:?}"
    );
    let migrated = migrated.unwrap();
    assert_eq!(migrated.version, schema::needed());
    schema::check(&db.pool).await.unwrap();
}

#[tokio::test]
async fn migrate_rebuilds_an_index_a_cut_short_build_left_and_takes_0019s_first_text() {
    use tidings_store::schema;
    let db = TestDb::empty().await.unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    schema::migrate(&mut conn).await.unwrap();
    // A concurrent build that fails leaves its index behind, invalid, as a killed one would.
    sqlx::raw_sql("CREATE TABLE scratch (a int); INSERT INTO scratch VALUES (1), (1)")
        .execute(&mut *conn)
        .await
        .unwrap();
    let cut_short = sqlx::raw_sql("CREATE UNIQUE INDEX CONCURRENTLY scratch_a ON scratch (a)")
        .execute(&mut *conn)
        .await;
    assert!(cut_short.is_err());
    let valid = "SELECT indisvalid FROM pg_index WHERE indexrelid = 'scratch_a'::regclass";
    let before: bool = sqlx::query_scalar(valid)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert!(!before);
    sqlx::raw_sql("DELETE FROM scratch WHERE ctid = (SELECT min(ctid) FROM scratch)")
        .execute(&mut *conn)
        .await
        .unwrap();
    // A database that applied 0019 before it was rewritten to build CONCURRENTLY.
    sqlx::query(
        "UPDATE _sqlx_migrations SET checksum = decode($1, 'hex') WHERE version = 19",
    )
    .bind("ffdea6f896df0ade45923c6110fc8c5ed6c4f95833197f43b2f188ca51b1bea22170addf32be9af33afa4fef8b3df9b1")
    .execute(&mut *conn)
    .await
    .unwrap();
    schema::migrate(&mut conn).await.unwrap();
    let after: bool = sqlx::query_scalar(valid)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert!(after, "migrate left the invalid index invalid");
    let now: Vec<u8> =
        sqlx::query_scalar("SELECT checksum FROM _sqlx_migrations WHERE version = 19")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    let carried = schema::MIGRATOR.iter().find(|m| m.version == 19).unwrap();
    assert_eq!(now, carried.checksum.to_vec());
    // Any other checksum is still refused: the acceptance is for that one text only.
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = 19")
        .execute(&mut *conn)
        .await
        .unwrap();
    assert!(matches!(
        schema::migrate(&mut conn).await,
        Err(sqlx::migrate::MigrateError::VersionMismatch(19))
    ));
}

/// The digest claim reads the due digest rows only, however many other rows are due: the
/// readers it asks for come from their own index (0030), where it used to read every due row of
/// the outbox and keep the digest ones, every second.
#[tokio::test]
async fn the_digest_claim_reads_only_digest_rows_however_many_others_are_due() {
    use tidings_store::claim;
    let db = TestDb::new().await.unwrap();
    let (_, id) = one_row(&db).await;
    let backlog = "INSERT INTO outbox (id, watch_id, device_id, trigger, channel, dedup_day,
                       detected_at, detected_price, detected_currency, detected_in_stock,
                       detected_paused, detected_observed_at)
                   SELECT gen_random_uuid(), watch_id, device_id, trigger || ':' || g, channel,
                       dedup_day, detected_at, detected_price, detected_currency,
                       detected_in_stock, detected_paused, detected_observed_at
                   FROM outbox, generate_series(1, 5000) AS g WHERE id = $1";
    sqlx::query(backlog)
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query("ANALYZE outbox")
        .execute(&db.pool)
        .await
        .unwrap();
    // The predicate claim::claim_digests asks its readers by.
    let plan: Vec<String> = sqlx::query_scalar(
        "EXPLAIN SELECT DISTINCT device_id FROM outbox
         WHERE held = 'digest' AND status IN ('pending', 'retry')
           AND next_attempt_at <= now() AND (claimed_until IS NULL OR claimed_until <= now())
         LIMIT 50",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let plan = plan.join("\n");
    // The row's partition reads the digest index, known by what it is attached to, not by its
    // name: `migrate` names a partition's own `<partition>_digests_due`, but a partition made
    // later (this row's week, 2026-11-30, once the template is built in a later week) gets the
    // name Postgres generates, `…_next_attempt_at_idx1`.
    let digest_indexes: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
         WHERE h.inhparent = 'outbox_digests_due'::regclass",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let reads = |index: &String| plan.contains(&format!("Index Scan using {index} on "));
    assert!(
        digest_indexes.iter().any(reads),
        "{digest_indexes:?}\n{plan}"
    );
    // (An empty partition, never analyzed, is read whole: nothing.)
    let scans_rows = |l: &&str| l.contains("Seq Scan") && !l.contains("cost=0.00..0.00");
    assert!(!plan.lines().any(|l| scans_rows(&l)), "{plan}");
    let lease = std::time::Duration::from_secs(60);
    let none = claim::claim_digests(&db.pool, 50, 50, lease).await.unwrap();
    assert!(none.is_empty(), "5,001 due rows, none held for a digest");
    sqlx::query("UPDATE outbox SET held = 'digest', updated_at = now() WHERE id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    let taken = claim::claim_digests(&db.pool, 50, 50, lease).await.unwrap();
    assert_eq!(taken.iter().map(|r| r.id).collect::<Vec<_>>(), [id]);
}

/// Whether each named index is valid, and how many partitions' indexes are attached to it.
async fn partitioned_index(conn: &mut sqlx::PgConnection, index: &str) -> (bool, i64) {
    let sql =
        "SELECT i.indisvalid, (SELECT count(*) FROM pg_inherits WHERE inhparent = i.indexrelid)
               FROM pg_index i WHERE i.indexrelid = $1::regclass";
    sqlx::query_as(sql)
        .bind(index)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// An index on the partitioned outbox is declared on the parent alone (`ON ONLY`, building
/// nothing under a lock) and `migrate` builds each partition's concurrently and attaches it: the
/// digest claim's index (0030) is whole after a migrate, a partition created later has it, and
/// a parent left with partitions missing (a migrate cut short) is completed by the next one.
#[tokio::test]
async fn migrate_completes_a_partitioned_index_one_partition_at_a_time() {
    use tidings_store::schema;
    let db = TestDb::empty().await.unwrap();
    let mut conn = db.pool.acquire().await.unwrap();
    schema::migrate(&mut conn).await.unwrap();
    let partitions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert!(partitions >= 2, "{partitions}");
    let digests = partitioned_index(&mut conn, "outbox_digests_due").await;
    assert_eq!(digests, (true, partitions));
    // A week created later has it as it is created.
    let (created,): (bool,) = sqlx::query_as("SELECT outbox_ensure_partition('2030-01-07')")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert!(created);
    let digests = partitioned_index(&mut conn, "outbox_digests_due").await;
    assert_eq!(digests, (true, partitions + 1));

    // A parent declared, its partitions' indexes not built yet: one left behind by a cut-short
    // migrate, a unique one included.
    sqlx::raw_sql(
        "CREATE TABLE scratch (a int, b int) PARTITION BY RANGE (a);
         CREATE TABLE scratch_1 PARTITION OF scratch FOR VALUES FROM (0) TO (10);
         CREATE TABLE scratch_2 PARTITION OF scratch FOR VALUES FROM (10) TO (20);
         INSERT INTO scratch VALUES (1, 1), (11, 1);
         CREATE INDEX scratch_b ON ONLY scratch (b) WHERE b > 0;
         CREATE UNIQUE INDEX scratch_ab ON ONLY scratch (a, b);",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    assert_eq!(partitioned_index(&mut conn, "scratch_b").await, (false, 0));
    let built = schema::complete_partitioned_indexes(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        built,
        [
            "public.scratch_1_ab",
            "public.scratch_2_ab",
            "public.scratch_1_b",
            "public.scratch_2_b"
        ]
    );
    assert_eq!(partitioned_index(&mut conn, "scratch_b").await, (true, 2));
    assert_eq!(partitioned_index(&mut conn, "scratch_ab").await, (true, 2));
    let definition: String = sqlx::query_scalar("SELECT pg_get_indexdef('scratch_2_b'::regclass)")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(
        definition,
        "CREATE INDEX scratch_2_b ON public.scratch_2 USING btree (b) WHERE (b > 0)"
    );
    let duplicate = sqlx::raw_sql("INSERT INTO scratch VALUES (11, 1)")
        .execute(&mut *conn)
        .await;
    assert!(
        duplicate.is_err(),
        "the partitions' indexes keep the parent's uniqueness"
    );
    // Nothing is left to do, and migrate does it again without complaint.
    assert!(
        schema::complete_partitioned_indexes(&mut conn)
            .await
            .unwrap()
            .is_empty()
    );
    schema::migrate(&mut conn).await.unwrap();
}

/// A transaction counting the PL/pgSQL functions' calls while it runs (track_functions).
async fn counting(db: &TestDb) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL track_functions = 'pl'")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

/// How often `function` was called in the transaction so far.
async fn function_calls(tx: &mut sqlx::PgConnection, function: &str) -> i64 {
    let sql = "SELECT coalesce(pg_stat_get_xact_function_calls($1::regproc), 0)";
    let (n,): (i64,) = sqlx::query_as(sql)
        .bind(function)
        .fetch_one(tx)
        .await
        .unwrap();
    n
}

/// The hot path's updates (a claim, a transition, three a notification) stamp their own time
/// and break no rule, so the guard trigger accepts them without calling its function (~2 µs of
/// Postgres a row update, migration 0028). An update that does not stamp still calls it.
#[tokio::test]
async fn the_claim_and_a_transition_take_the_guards_fast_path() {
    let db = TestDb::new().await.unwrap();
    let (_, id) = one_row(&db).await;
    let (_, other) = one_row(&db).await;
    let calls = async |tx: &mut sqlx::PgConnection| function_calls(tx, "outbox_guard").await;

    let mut tx = counting(&db).await;
    // An update that leaves its time to the function calls it (and puts the other row off).
    sqlx::query("UPDATE outbox SET next_attempt_at = now() + interval '1 hour' WHERE id = $1")
        .bind(other)
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(
        calls(&mut tx).await,
        1,
        "an update not stamping its time skipped the function"
    );
    let claimed = tidings_store::claim::statement(10, 30.0)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "not the one due row claimed");
    assert_eq!(
        calls(&mut tx).await,
        1,
        "the claim called the guard's function"
    );
    tx.commit().await.unwrap();

    // The row goes out in a transaction of its own, as in the dispatcher.
    let mut tx = counting(&db).await;
    let row = claimed[0].row();
    let t = outbox::apply(row, Event::Dispatched, 5).unwrap();
    let mut change = Change::new(id, claimed[0].dedup_day, row, t);
    change.lease_until = Some(Utc::now() + chrono::Duration::minutes(1));
    change.deadline = Some(Utc::now());
    let won = transition::apply(&mut tx, &[change]).await.unwrap();
    assert!(won.contains(&id), "the row did not go out");
    assert_eq!(
        calls(&mut tx).await,
        0,
        "the transition called the guard's function"
    );
}

/// A transition reads its rows by key however much their partition grew since the connection
/// planned it. A week's partition starts empty; Postgres settles on one plan for a statement a
/// connection runs often and keeps it until the partition is next analyzed. Made while the
/// partition was small, that plan joined the changes by hash over a scan of it: thousands of
/// rows later, a batch read every page (regression: `bench pipeline` rounds at 109–139 buffers a
/// `sent`, not ~90).
#[tokio::test]
async fn a_transition_reads_its_rows_by_key_after_its_partition_grew() {
    let db = TestDb::new().await.unwrap();
    let (_, id) = one_row(&db).await;
    let (partition, day): (String, NaiveDate) =
        sqlx::query_as("SELECT tableoid::regclass::text, dedup_day FROM outbox WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    // The partition small, its statistics saying so, kept so for the test.
    grow(&db, id, 1_000).await;
    let keep = format!("ALTER TABLE {partition} SET (autovacuum_enabled = false)");
    sqlx::query(&keep).execute(&db.pool).await.unwrap();
    let analyze = format!("ANALYZE {partition}");
    sqlx::query(&analyze).execute(&db.pool).await.unwrap();
    let pending = outbox::Row {
        status: Status::Pending,
        retry_count: 0,
        attempt: 0,
    };
    let going_out = |id: OutboxId| {
        let t = outbox::apply(pending, Event::Dispatched, 5).unwrap();
        let mut change = Change::new(id, day, pending, t);
        change.lease_until = Some(Utc::now() + chrono::Duration::minutes(1));
        change.deadline = Some(Utc::now());
        change
    };
    // A batch as the dispatcher writes one: 100 changes, here of rows that do not exist but for
    // `first`.
    let batch = |first: Option<OutboxId>| -> Vec<Change> {
        let others = (0..99).map(|_| OutboxId::new());
        first.into_iter().chain(others).map(going_out).collect()
    };
    // One connection, as a dispatcher's pooled one, runs it often enough to keep a plan.
    let mut conn = db.pool.acquire().await.unwrap();
    for _ in 0..10 {
        let won = transition::apply(&mut conn, &batch(None)).await.unwrap();
        assert!(won.is_empty(), "a change of no row moved one");
    }
    grow(&db, id, 10_000).await;
    let (pages,): (i64,) = sqlx::query_as(
        "SELECT pg_relation_size($1::regclass) / current_setting('block_size')::int",
    )
    .bind(&partition)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(pages > 500, "the partition holds only {pages} pages");

    // The backend's counts include what it has not reported yet, so the batch's reads are the
    // difference, inside one transaction (counts are reported between transactions).
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let before = blocks_fetched(&mut tx, &partition).await;
    let won = transition::apply(&mut tx, &batch(Some(id))).await.unwrap();
    assert_eq!(won.len(), 1, "the row did not go out, or another did");
    let read = blocks_fetched(&mut tx, &partition).await - before;
    tx.commit().await.unwrap();
    assert!(
        read < 20,
        "a batch read {read} of the partition's {pages} pages: its rows were not found by key"
    );
}

/// The blocks of `table` this backend asked for, reported or not.
async fn blocks_fetched(tx: &mut sqlx::PgConnection, table: &str) -> i64 {
    let sql = "SELECT pg_stat_get_xact_blocks_fetched($1::regclass)";
    let (n,): (i64,) = sqlx::query_as(sql).bind(table).fetch_one(tx).await.unwrap();
    n
}

/// Adds `n` copies of row `id` to its partition, each of a watch of its own (so each its own
/// dedup key).
async fn grow(db: &TestDb, id: OutboxId, n: i32) {
    sqlx::query(
        "INSERT INTO outbox
         SELECT (json_populate_record(o, json_build_object('id', gen_random_uuid(),
                                                           'watch_id', gen_random_uuid()))).*
         FROM outbox o, generate_series(1, $2)
         WHERE o.id = $1",
    )
    .bind(id)
    .bind(n)
    .execute(&db.pool)
    .await
    .unwrap();
}

/// Runs `sql` with `id` for its `$1`.
async fn exec(tx: &mut sqlx::PgConnection, sql: &str, id: Uuid) {
    sqlx::query(sql).bind(id).execute(tx).await.unwrap();
}

/// Every write of a baseline carries the id of its transaction, which is how the detector finds
/// what changed since its last read: whether the statement marks its rows or leaves them to the
/// trigger's function. The results' upsert marks its own (the column's default, or set), so the
/// function is not called for it (~2–4 µs of Postgres a baseline, migration 0029).
#[tokio::test]
async fn every_write_of_a_baseline_is_marked_and_the_upsert_marks_its_own() {
    let db = TestDb::new().await.unwrap();
    let (kept, moved, inserted) = (WatchId::new(), WatchId::new(), WatchId::new());
    let advance = |watch_id, price| tidings_store::baselines::Advance {
        watch_id,
        trigger: "price_below",
        price,
        in_stock: true,
        outbox_id: OutboxId::new(),
        promise: None,
    };
    let mut tx = db.pool.begin().await.unwrap();
    let first = [advance(kept, 1100), advance(moved, 1100)];
    tidings_store::baselines::advance(&mut tx, &first, Utc::now())
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut tx = counting(&db).await;
    let calls = async |tx: &mut sqlx::PgConnection| function_calls(tx, "mark_changed").await;
    // One baseline moved (the upsert's update), one new (its insert).
    let second = [advance(moved, 1000), advance(inserted, 1000)];
    tidings_store::baselines::advance(&mut tx, &second, Utc::now())
        .await
        .unwrap();
    assert_eq!(
        calls(&mut tx).await,
        0,
        "the upsert called the mark's function"
    );
    // Statements that do not mark, or mark wrongly, are marked by the function.
    exec(
        &mut tx,
        "UPDATE baselines SET price = 1050 WHERE watch_id = $1",
        kept.0,
    )
    .await;
    exec(
        &mut tx,
        "UPDATE baselines SET changed_xid = '1' WHERE watch_id = $1",
        inserted.0,
    )
    .await;
    assert_eq!(
        calls(&mut tx).await,
        2,
        "an unmarked write skipped the function"
    );
    let marked: Vec<(Uuid, bool)> = sqlx::query_as(
        "SELECT watch_id, changed_xid = pg_current_xact_id() FROM baselines ORDER BY watch_id",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    let mut expected: Vec<(Uuid, bool)> = [kept, moved, inserted].map(|w| (w.0, true)).to_vec();
    expected.sort();
    assert_eq!(marked, expected, "a write not marked with its transaction");
}

/// The same for watches: an insert leaves the mark to the column's default and skips the
/// function (the api's creates); an update that does not mark runs it.
#[tokio::test]
async fn every_write_of_a_watch_is_marked_and_an_insert_marks_its_own() {
    let db = TestDb::new().await.unwrap();
    let (_, watch) = watched(&db, "UTC").await;
    let mut tx = counting(&db).await;
    let calls = async |tx: &mut sqlx::PgConnection| function_calls(tx, "mark_changed").await;
    exec(
        &mut tx,
        "INSERT INTO watches (id, device_id, item_code, triggers)
         SELECT gen_random_uuid(), device_id, 'SKU-2', triggers FROM watches WHERE id = $1",
        watch.0,
    )
    .await;
    assert_eq!(
        calls(&mut tx).await,
        0,
        "the insert called the mark's function"
    );
    exec(
        &mut tx,
        "UPDATE watches SET paused = true WHERE id = $1",
        watch.0,
    )
    .await;
    assert_eq!(
        calls(&mut tx).await,
        1,
        "an unmarked update skipped the function"
    );
    let (marked, all): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE changed_xid = pg_current_xact_id()), count(*) FROM watches",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    assert_eq!(
        (marked, all),
        (2, 2),
        "a write not marked with its transaction"
    );
}
