-- One record per delivery attempt (docs/design.md, "Attempts"): when it was made, through which
-- subscription and push host, how it ended, with the push service's status, error and message
-- id. The trace is the row's (its traceparent), so it is not repeated.
--
-- The attempt that ends a row (delivered, gone, refused, or the last one before the retry cap)
-- is recorded on the row itself by the update that ends it: its outcome, start, push host and
-- duration in the columns below, its status, message id and error in the row's own. Every
-- earlier attempt — one whose outcome sent the row back to `retry` — is a row of
-- `outbox_attempts`. Most notifications are delivered at their first attempt, so most results
-- write no extra row: in the dispatcher benchmark's results stage a table row per attempt cost
-- 11-16 % more CPU per result, a jsonb array on the row 30 %, a text array 18 %.
--
-- Both are written by the dispatcher in the transaction that applies the result (or the lease
-- sweeper's `lease_expired` when no result came), so an attempt is on record exactly when its row
-- moved. The table is partitioned like the outbox, by week of the row's dedup day, and dropped
-- with the outbox's week: attempts live as long as their notification. Constant (null) defaults
-- make the new columns a catalogue-only change.

ALTER TABLE outbox
    ADD COLUMN attempt_outcome text,
    ADD COLUMN attempt_started_at timestamptz,
    ADD COLUMN attempt_push_host text,
    ADD COLUMN attempt_ms bigint;

CREATE TABLE outbox_attempts (
    outbox_id       uuid NOT NULL,
    dedup_day       date NOT NULL,
    attempt         integer NOT NULL CHECK (attempt >= 1),
    -- When the pusher started the attempt; null when no result came (lease_expired).
    started_at      timestamptz,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    subscription_id uuid,
    push_host       text,
    -- delivered, transient, gone, permanent, expired (PushResult outcomes), or lease_expired.
    outcome         text NOT NULL,
    http_status     integer,
    error           text,
    duration_ms     bigint,
    push_message_id text,
    PRIMARY KEY (outbox_id, dedup_day, attempt)
) PARTITION BY RANGE (dedup_day);

CREATE FUNCTION outbox_attempts_partition_name(week date) RETURNS text IMMUTABLE LANGUAGE sql
    AS $$ SELECT 'outbox_attempts_' || to_char(week, 'YYYYMMDD') $$;

-- An attempts partition for every outbox week there is.
DO $$
DECLARE
    w date;
BEGIN
    FOR w IN
        SELECT to_date(substr(c.relname, 8), 'YYYYMMDD')
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'outbox'::regclass AND c.relname ~ '^outbox_[0-9]{8}$'
    LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF outbox_attempts FOR VALUES FROM (%L) TO (%L)',
                       outbox_attempts_partition_name(w), w, w + 7);
    END LOOP;
END
$$;

-- As in 0010, now making the week's attempts partition alongside the outbox's.
CREATE OR REPLACE FUNCTION outbox_ensure_partition(day date) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    week date := date_trunc('week', day)::date;
    name text := outbox_partition_name(date_trunc('week', day)::date);
    attempts text := outbox_attempts_partition_name(date_trunc('week', day)::date);
BEGIN
    IF to_regclass(name) IS NOT NULL AND to_regclass(attempts) IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('tidings.outbox_partitions'));
    IF to_regclass(attempts) IS NULL THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF outbox_attempts FOR VALUES FROM (%L) TO (%L)',
                       attempts, week, week + 7);
    END IF;
    IF to_regclass(name) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF outbox FOR VALUES FROM (%L) TO (%L)
                    WITH (fillfactor = 50)', name, week, week + 7);
    RETURN true;
END $$;

-- As in 0010, now dropping the week's attempts with its rows.
CREATE OR REPLACE FUNCTION outbox_drop_partition(week date, retention_days integer) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    name text := outbox_partition_name(week);
    attempts text := outbox_attempts_partition_name(week);
    live boolean;
BEGIN
    IF retention_days IS NULL OR retention_days < 8 THEN
        RAISE EXCEPTION 'a retention of % days is below the minimum of 8', retention_days
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF week IS NULL OR week <> date_trunc('week', week)::date THEN
        RAISE EXCEPTION '% is not the Monday a partition starts on', week
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF week + 7 > current_date - retention_days THEN
        RAISE EXCEPTION 'partition % is inside the % day retention window', name, retention_days
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF to_regclass(name) IS NULL THEN
        IF to_regclass(attempts) IS NOT NULL THEN
            PERFORM set_config('lock_timeout', '1s', true);
            LOCK TABLE outbox_attempts IN ACCESS EXCLUSIVE MODE;
            EXECUTE format('ALTER TABLE outbox_attempts DETACH PARTITION %I', attempts);
            EXECUTE format('DROP TABLE %I', attempts);
        END IF;
        RETURN 'absent';
    END IF;
    PERFORM set_config('lock_timeout', '1s', true);
    LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE status IN (''pending'', ''retry'', ''sending''))',
                   name) INTO live;
    IF live THEN
        RETURN 'kept';
    END IF;
    IF to_regclass(attempts) IS NOT NULL THEN
        LOCK TABLE outbox_attempts IN ACCESS EXCLUSIVE MODE;
        EXECUTE format('ALTER TABLE outbox_attempts DETACH PARTITION %I', attempts);
        EXECUTE format('DROP TABLE %I', attempts);
    END IF;
    EXECUTE format('ALTER TABLE outbox DETACH PARTITION %I', name);
    EXECUTE format('DROP TABLE %I', name);
    RETURN 'dropped';
END $$;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_api') THEN
        GRANT SELECT ON outbox_attempts TO tidings_api;
    END IF;
    -- UPDATE: a result that turns up after the sweeper recorded `lease_expired` replaces it.
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        GRANT SELECT, INSERT, UPDATE ON outbox_attempts TO tidings_dispatcher;
    END IF;
END
$$;
