-- What the api needs: watch limits that hold under concurrent creates, idempotent creates, and
-- operator replays of terminal rows.

-- Active watches per device, kept by the api in the same statement that adds or removes a watch,
-- so the per-device limit is a single conditional UPDATE rather than a racy count.
ALTER TABLE devices ADD COLUMN watch_count integer NOT NULL DEFAULT 0 CHECK (watch_count >= 0);
UPDATE devices d SET watch_count = (
    SELECT count(*) FROM watches w WHERE w.device_id = d.id AND w.removed_at IS NULL
);

-- A replay is a new row with the same dedup key as the row it replays, linked by replay_of; the
-- dedup key stays unique among detections. A row is replayed at most once (replay the replay).
ALTER TABLE outbox DROP CONSTRAINT outbox_dedup;
CREATE UNIQUE INDEX outbox_dedup ON outbox (watch_id, trigger, dedup_day, channel)
    WHERE replay_of IS NULL;
CREATE UNIQUE INDEX outbox_replay ON outbox (replay_of) WHERE replay_of IS NOT NULL;

-- POST /v1/watches with an Idempotency-Key: the first response, kept for a day.
CREATE TABLE idempotency_keys (
    device_id    uuid NOT NULL REFERENCES devices (id),
    key          text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    -- SHA-256 of the request body: the same key with a different body is refused.
    request_hash bytea NOT NULL,
    status       smallint NOT NULL,
    response     jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (device_id, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);
