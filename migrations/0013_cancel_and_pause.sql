-- Operator controls (docs/operations.md, "Operator tooling"):
--
-- - a paused device: its due notifications are withheld at the re-check (`device_paused`), as a
--   paused watch's are, until an operator resumes it;
-- - a cancelled notification: an operator ends a pending or retrying row `dropped` with reason
--   `cancelled`. The guard allows that reason on that edge only, so no service can record it
--   and no row in flight (`sending`, whose push may already be out) can be cancelled.

ALTER TABLE devices ADD COLUMN paused_at timestamptz;

CREATE OR REPLACE FUNCTION outbox_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ('sent', 'dropped', 'failed') THEN
        RAISE EXCEPTION 'outbox row % is % (terminal) and cannot change', OLD.id, OLD.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF NOT (
        (OLD.status = NEW.status AND OLD.status IN ('pending', 'retry'))
        OR (OLD.status = 'pending' AND NEW.status IN ('retry', 'sending', 'dropped', 'failed'))
        OR (OLD.status = 'retry' AND NEW.status IN ('retry', 'sending', 'sent', 'dropped', 'failed'))
        OR (OLD.status = 'sending' AND NEW.status IN ('sent', 'retry', 'dropped', 'failed'))
    ) THEN
        RAISE EXCEPTION 'outbox row %: illegal transition % -> %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.reason = 'cancelled' AND NOT (OLD.status IN ('pending', 'retry') AND NEW.status = 'dropped') THEN
        RAISE EXCEPTION 'outbox row %: only a pending or retrying row can be cancelled (it is %)',
            OLD.id, OLD.status USING ERRCODE = 'check_violation';
    END IF;
    IF (NEW.watch_id, NEW.device_id, NEW.trigger, NEW.channel, NEW.dedup_day, NEW.detected_at,
        NEW.detected_price, NEW.detected_currency, NEW.detected_in_stock, NEW.detected_paused,
        NEW.detected_observed_at, NEW.baseline_price, NEW.baseline_reference, NEW.baseline_in_stock)
       IS DISTINCT FROM
       (OLD.watch_id, OLD.device_id, OLD.trigger, OLD.channel, OLD.dedup_day, OLD.detected_at,
        OLD.detected_price, OLD.detected_currency, OLD.detected_in_stock, OLD.detected_paused,
        OLD.detected_observed_at, OLD.baseline_price, OLD.baseline_reference, OLD.baseline_in_stock) THEN
        RAISE EXCEPTION 'outbox row %: the detection snapshot is immutable', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.attempt < OLD.attempt OR NEW.retry_count < OLD.retry_count THEN
        RAISE EXCEPTION 'outbox row %: attempt and retry_count never decrease', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.maybe_delivered AND NOT NEW.maybe_delivered THEN
        RAISE EXCEPTION 'outbox row %: maybe_delivered is never cleared', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

-- The api cancels rows (operators) and pauses devices; the dispatcher reads the pause.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_api') THEN
        GRANT UPDATE (status, reason, last_error, finished_at) ON outbox
            TO tidings_api;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        GRANT SELECT (paused_at) ON devices TO tidings_dispatcher;
    END IF;
END
$$;
