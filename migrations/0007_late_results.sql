-- Late push results and attempts whose outcome is unknown (see shared/domain/src/outbox.rs).
--
-- A result belongs to one attempt and is honoured whenever it arrives, as long as the row has not
-- started a newer attempt: a `delivered` that arrives after the sweeper moved the row back to
-- `retry` ends it `sent`. The guard below adds that one edge, retry -> sent.
--
-- maybe_delivered marks a row one of whose attempts may have reached the user although no
-- delivery was confirmed (a timeout after the request went out, a lease that ran out with no
-- result and no delivery on record). It is never cleared: a row that then ends `dropped` or
-- `failed` is shown as "may have been delivered", not "withheld". A constant default makes this
-- a catalogue-only change, with no rewrite of the table.
ALTER TABLE outbox ADD COLUMN maybe_delivered boolean NOT NULL DEFAULT false;

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
