-- The outbox, partitioned by week of its dedup day (docs/design.md, "Retention"), so a whole
-- expired week leaves by dropping its partition: rows themselves are still never deleted.
--
-- Weeks rather than days: a lookup by id alone (results, the sweeper, the operator routes) reads
-- every partition's primary-key index, and at the default 30-day retention that is 6 of them
-- rather than 38. Partitions are made ahead of time by the dispatcher's retention loop, and on
-- demand by ingest for a day that has none (outbox_ensure_partition). Both need no privilege on
-- the table beyond their role's: the functions below run as the schema owner and check what they
-- are asked.
--
-- This migration copies the existing rows into the new table in one transaction, and the outbox
-- is locked while it runs: for a large outbox, run it in a maintenance window (docs/operations.md,
-- "Retention", has the time it took here and the procedure).

CREATE TABLE outbox_partitioned (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
    PARTITION BY RANGE (dedup_day);

-- A week's partition: [Monday, next Monday). Fill factor 50, as 0003 chose for the outbox.
CREATE FUNCTION outbox_partition_name(week date) RETURNS text IMMUTABLE LANGUAGE sql
    AS $$ SELECT 'outbox_' || to_char(week, 'YYYYMMDD') $$;

DO $$
DECLARE
    w date;
BEGIN
    FOR w IN
        SELECT DISTINCT date_trunc('week', dedup_day)::date FROM outbox
        UNION
        SELECT generate_series(date_trunc('week', current_date - 1),
                               date_trunc('week', current_date) + interval '28 days',
                               interval '7 days')::date
    LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF outbox_partitioned FOR VALUES FROM (%L) TO (%L)
                        WITH (fillfactor = 50)', outbox_partition_name(w), w, w + 7);
    END LOOP;
END
$$;

INSERT INTO outbox_partitioned SELECT * FROM outbox;
DROP TABLE outbox;
ALTER TABLE outbox_partitioned RENAME TO outbox;

-- A partitioned table's unique indexes must hold its partition key. The dedup key already does;
-- the id is unique by itself (UUIDv7) and (id, dedup_day) is the key a lookup can prune with.
ALTER TABLE outbox ADD PRIMARY KEY (id, dedup_day);
CREATE UNIQUE INDEX outbox_dedup ON outbox (watch_id, trigger, dedup_day, channel)
    WHERE replay_of IS NULL;
-- A replay has its original's dedup day (checked below), so this is "replayed at most once".
CREATE UNIQUE INDEX outbox_replay ON outbox (replay_of, dedup_day) WHERE replay_of IS NOT NULL;
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE status IN ('pending', 'retry');
CREATE INDEX outbox_leases ON outbox (lease_until) WHERE status = 'sending';
CREATE INDEX outbox_device ON outbox (device_id, id);
CREATE INDEX outbox_reason ON outbox (status, reason) WHERE reason IS NOT NULL;

CREATE TRIGGER outbox_guard BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION outbox_guard();
CREATE TRIGGER outbox_no_delete BEFORE DELETE ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_no_delete();

-- A replay names an existing row of the same dedup day (so it lands in its original's partition).
CREATE OR REPLACE FUNCTION outbox_replay_of_exists() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM outbox WHERE id = NEW.replay_of AND dedup_day = NEW.dedup_day) THEN
        RAISE EXCEPTION 'outbox row % replays %, which does not exist on %', NEW.id, NEW.replay_of,
            NEW.dedup_day USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER outbox_replay_of_exists BEFORE INSERT OR UPDATE OF replay_of ON outbox
    FOR EACH ROW WHEN (NEW.replay_of IS NOT NULL) EXECUTE FUNCTION outbox_replay_of_exists();

-- Creates the partition of `day`'s week unless it exists; true if it made it.
CREATE FUNCTION outbox_ensure_partition(day date) RETURNS boolean
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    week date := date_trunc('week', day)::date;
    name text := outbox_partition_name(date_trunc('week', day)::date);
BEGIN
    IF to_regclass(name) IS NOT NULL THEN
        RETURN false;
    END IF;
    -- Two ingesters that both find it missing: one creates it, the other sees it made.
    PERFORM pg_advisory_xact_lock(hashtext('tidings.outbox_partitions'));
    IF to_regclass(name) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF outbox FOR VALUES FROM (%L) TO (%L)
                    WITH (fillfactor = 50)', name, week, week + 7);
    RETURN true;
END $$;

-- Drops the partition of the week starting `week` if the whole week is older than
-- `retention_days` (at least 8: longer than the enqueue stream keeps a message, 7 days, and the
-- longest retry schedule) and none of its rows is still to be decided. Returns what it did:
-- 'dropped', 'kept' (a row is pending, retry or sending: alert), or 'absent'.
CREATE FUNCTION outbox_drop_partition(week date, retention_days integer) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    name text := outbox_partition_name(week);
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
        RETURN 'absent';
    END IF;
    -- Nothing may write the week between the check and the drop (a replay inserts into its
    -- original's week). Waiting for the lock queues every outbox query behind it, so wait little
    -- and try again at the next run.
    PERFORM set_config('lock_timeout', '1s', true);
    LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE status IN (''pending'', ''retry'', ''sending''))',
                   name) INTO live;
    IF live THEN
        RETURN 'kept';
    END IF;
    EXECUTE format('ALTER TABLE outbox DETACH PARTITION %I', name);
    EXECUTE format('DROP TABLE %I', name);
    RETURN 'dropped';
END $$;

REVOKE ALL ON FUNCTION outbox_ensure_partition(date) FROM PUBLIC;
REVOKE ALL ON FUNCTION outbox_drop_partition(date, integer) FROM PUBLIC;

-- The grants of 0008 on the new table, and the partition functions to the dispatcher.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_api') THEN
        GRANT SELECT, INSERT ON outbox TO tidings_api;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        GRANT SELECT, INSERT, UPDATE ON outbox TO tidings_dispatcher;
        GRANT EXECUTE ON FUNCTION outbox_ensure_partition(date) TO tidings_dispatcher;
        GRANT EXECUTE ON FUNCTION outbox_drop_partition(date, integer) TO tidings_dispatcher;
    END IF;
END
$$;
