-- Soft-deleted watches, devices and deactivated subscriptions are deleted for good once no
-- retained outbox row can refer to them (docs/design.md, "Retention"). The dispatcher's retention
-- round calls tidings_purge_removed after dropping expired weeks.
--
-- "Can refer": a row refers to a watch, device or subscription only if it was detected, or sent,
-- while that one was active; its dedup day is then at most a day after the removal (a time zone
-- ahead). The outbox holds no row of a day before its oldest week, so whatever was removed more
-- than two days before that week began is referred to by no row. Watches and devices are also
-- checked against the outbox directly (both are indexed there); subscriptions, which the outbox
-- does not index, by that rule alone.

CREATE INDEX watches_removed ON watches (removed_at) WHERE removed_at IS NOT NULL;
CREATE INDEX devices_removed ON devices (removed_at) WHERE removed_at IS NOT NULL;
CREATE INDEX push_subscriptions_inactive ON push_subscriptions (deactivated_at) WHERE NOT active;

-- Deletes up to `batch` of each kind; returns how many of each went. Run it until it returns
-- fewer than `batch` to purge everything due.
CREATE FUNCTION tidings_purge_removed(batch integer)
    RETURNS TABLE (watches bigint, subscriptions bigint, devices bigint)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    oldest date;
    before timestamptz;
BEGIN
    SELECT min(to_date(substr(c.relname, 8), 'YYYYMMDD')) INTO oldest
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = 'outbox'::regclass AND c.relname ~ '^outbox_[0-9]{8}$';
    watches := 0; subscriptions := 0; devices := 0;
    IF oldest IS NULL OR batch IS NULL OR batch < 1 THEN
        RETURN NEXT;
        RETURN;
    END IF;
    before := (oldest - 2)::timestamp AT TIME ZONE 'UTC';

    WITH gone AS (
        DELETE FROM watches w
        WHERE w.id IN (
            SELECT x.id FROM watches x
            WHERE x.removed_at < before
              AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.watch_id = x.id AND o.replay_of IS NULL)
            LIMIT batch)
        RETURNING w.id
    ), baselines_gone AS (
        DELETE FROM baselines b USING gone WHERE b.watch_id = gone.id
    )
    SELECT count(*) INTO watches FROM gone;

    WITH gone AS (
        DELETE FROM push_subscriptions s
        WHERE s.id IN (
            SELECT x.id FROM push_subscriptions x
            WHERE NOT x.active AND x.deactivated_at < before
            LIMIT batch)
        RETURNING s.id
    )
    SELECT count(*) INTO subscriptions FROM gone;

    WITH gone AS (
        DELETE FROM devices d
        WHERE d.id IN (
            SELECT x.id FROM devices x
            WHERE x.removed_at < before
              AND NOT EXISTS (SELECT 1 FROM watches w WHERE w.device_id = x.id)
              AND NOT EXISTS (SELECT 1 FROM push_subscriptions s WHERE s.device_id = x.id)
              AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.device_id = x.id)
            LIMIT batch)
        RETURNING d.id
    ), keys_gone AS (
        DELETE FROM idempotency_keys k USING gone WHERE k.device_id = gone.id
    )
    SELECT count(*) INTO devices FROM gone;
    RETURN NEXT;
END $$;

REVOKE ALL ON FUNCTION tidings_purge_removed(integer) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        GRANT EXECUTE ON FUNCTION tidings_purge_removed(integer) TO tidings_dispatcher;
    END IF;
END
$$;
