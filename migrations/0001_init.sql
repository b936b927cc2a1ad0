-- Tidings schema. Prices are integer minor units (cents). Ids are UUIDv7 made by the services.

CREATE TABLE devices (
    id          uuid PRIMARY KEY,
    -- SHA-256 of the device token; the token itself is shown once and never stored.
    token_hash  bytea NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
    -- IANA name; the dedup day of a notification is the calendar day in this zone.
    time_zone   text NOT NULL DEFAULT 'UTC',
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Devices are soft-deleted so their notification history stays explainable.
    removed_at  timestamptz
);

CREATE TABLE push_subscriptions (
    id                  uuid PRIMARY KEY,
    device_id           uuid NOT NULL REFERENCES devices (id),
    endpoint            text NOT NULL,
    p256dh              text NOT NULL,
    auth                text NOT NULL,
    active              boolean NOT NULL DEFAULT true,
    deactivated_at      timestamptz,
    deactivation_reason text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    CHECK (active = (deactivated_at IS NULL)),
    CHECK (active OR deactivation_reason IS NOT NULL)
);
CREATE UNIQUE INDEX push_subscriptions_one_active ON push_subscriptions (device_id) WHERE active;

CREATE TABLE watches (
    id              uuid PRIMARY KEY,
    device_id       uuid NOT NULL REFERENCES devices (id),
    item_code       text NOT NULL CHECK (length(item_code) BETWEEN 1 AND 128),
    -- JSON array of triggers, e.g. [{"kind":"price_below","threshold":120000}].
    triggers        jsonb NOT NULL CHECK (jsonb_typeof(triggers) = 'array' AND jsonb_array_length(triggers) > 0),
    channel         text NOT NULL DEFAULT 'web_push' CHECK (channel IN ('web_push')),
    -- Price when the watch was created: the reference of price_drop until a notification is sent.
    reference_price bigint,
    -- The item's stock state at this watch's last scan: the "previous observation" that
    -- back_in_stock compares with. Kept per watch, so each detector shard owns the state of the
    -- watches it scans; written only when it changes.
    last_in_stock   boolean,
    paused          boolean NOT NULL DEFAULT false,
    removed_at      timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
-- The detector pages through active watches in (item_code, id) order (keyset pagination), so each
-- item's watches are contiguous and the item is fetched once per scan.
CREATE INDEX watches_scan ON watches (item_code, id) WHERE removed_at IS NULL AND NOT paused;
CREATE INDEX watches_device ON watches (device_id, id) WHERE removed_at IS NULL;

-- What the last *sent* notification of a (watch, trigger) said. Moves only on `sent`, in the same
-- transaction that marks the outbox row sent.
CREATE TABLE baselines (
    watch_id   uuid NOT NULL REFERENCES watches (id),
    trigger    text NOT NULL,
    price      bigint NOT NULL,
    in_stock   boolean NOT NULL,
    outbox_id  uuid NOT NULL,
    sent_at    timestamptz NOT NULL,
    PRIMARY KEY (watch_id, trigger)
);

-- One row per notification, from detection to its terminal state. The outbox is the hot table:
-- it has no foreign keys (they doubled the cost of every ingest insert). Ingest checks that each
-- watch exists and belongs to the device before inserting; watches, devices and subscriptions
-- are only ever soft-deleted, so the ids stay resolvable.
CREATE TABLE outbox (
    id               uuid PRIMARY KEY,
    watch_id         uuid NOT NULL,
    device_id        uuid NOT NULL,
    -- The trigger with its parameters, as its key (e.g. "price_below:120000").
    trigger          text NOT NULL,
    channel          text NOT NULL CHECK (channel IN ('web_push')),
    dedup_day        date NOT NULL,
    status           text NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'retry', 'sending', 'sent', 'dropped', 'failed')),
    -- Why a row was dropped or failed; required for those states, absent otherwise.
    reason           text,
    -- The immutable detection snapshot (typed columns: parsing JSON was ~45 % of an insert) and
    -- the baseline detection evaluated against.
    detected_at          timestamptz NOT NULL,
    detected_price       bigint NOT NULL,
    detected_currency    text NOT NULL,
    detected_in_stock    boolean NOT NULL,
    detected_paused      boolean NOT NULL,
    detected_observed_at timestamptz NOT NULL,
    baseline_price       bigint,
    baseline_reference   bigint,
    baseline_in_stock    boolean,
    -- The value observed at the last re-check (condition_lost records it) and the value sent.
    checked          jsonb,
    sent_value       jsonb,
    payload          jsonb,
    -- The subscription the row was sent to: a `gone` result deactivates exactly that one.
    subscription_id  uuid,
    attempt          integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    retry_count      integer NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    -- When the row is next due for the dispatcher.
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    -- A claim hides a due row from other dispatchers until then. Not indexed, so a claim is a
    -- HOT update; every state transition clears it.
    claimed_until    timestamptz,
    -- While `sending`: when the sweeper may consider the push lost.
    lease_until      timestamptz,
    deadline         timestamptz,
    last_error       text,
    http_status      integer,
    push_message_id  text,
    -- W3C traceparent of the detection, so dispatch and results join the notification's trace.
    traceparent      text,
    replay_of        uuid REFERENCES outbox (id),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz,
    CONSTRAINT outbox_dedup UNIQUE (watch_id, trigger, dedup_day, channel),
    CHECK ((status IN ('dropped', 'failed')) = (reason IS NOT NULL)),
    CHECK ((status IN ('sent', 'dropped', 'failed')) = (finished_at IS NOT NULL)),
    CHECK (status <> 'sending' OR (lease_until IS NOT NULL AND deadline IS NOT NULL))
) WITH (fillfactor = 80);  -- room on each page for HOT updates (claims)

-- The claim reads only due rows, oldest first.
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE status IN ('pending', 'retry');
-- The sweeper reads only sending rows whose lease ran out.
CREATE INDEX outbox_leases ON outbox (lease_until) WHERE status = 'sending';
-- History per device, newest first (UUIDv7 ids are time-ordered).
CREATE INDEX outbox_device ON outbox (device_id, id);
-- Operators filter withheld and failed rows by reason; only those rows have one.
CREATE INDEX outbox_reason ON outbox (status, reason) WHERE reason IS NOT NULL;

-- The database refuses what the state machine refuses (shared/src/outbox.rs lists the same pairs):
-- terminal rows never change, and status moves only along legal edges. Same-status updates are
-- allowed for pending and retry rows, whose lease (next_attempt_at) a claim moves.
CREATE FUNCTION outbox_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status IN ('sent', 'dropped', 'failed') THEN
        RAISE EXCEPTION 'outbox row % is % (terminal) and cannot change', OLD.id, OLD.status
            USING ERRCODE = 'check_violation';
    END IF;
    IF NOT (
        (OLD.status = NEW.status AND OLD.status IN ('pending', 'retry'))
        OR (OLD.status IN ('pending', 'retry') AND NEW.status IN ('retry', 'sending', 'dropped', 'failed'))
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
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER outbox_guard BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION outbox_guard();

-- History is evidence: outbox rows are never deleted.
CREATE FUNCTION outbox_no_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'outbox row % cannot be deleted', OLD.id USING ERRCODE = 'check_violation';
END
$$;
CREATE TRIGGER outbox_no_delete BEFORE DELETE ON outbox FOR EACH ROW EXECUTE FUNCTION outbox_no_delete();
