-- Webhooks, a second channel (docs/webhooks.md). A webhook endpoint is a device whose one active
-- subscription is a URL rather than a browser's push subscription: its watches, history,
-- attempts, pause and removal are a device's. Only an API client holding a key the operator
-- issued may register one, so the public api cannot be made to post to anyone's URL.
--
-- The signing secret is kept as given to the client (the dispatcher signs every webhook with it,
-- a hash would not do), readable only by the roles that select push_subscriptions already. While
-- a secret is rotated, the previous one keeps signing beside it until previous_until.

CREATE TABLE api_clients (
    id         uuid PRIMARY KEY,
    name       text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    -- SHA-256 of the client key; the key itself is shown once.
    key_hash   bytea NOT NULL UNIQUE CHECK (octet_length(key_hash) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

-- The channel a device's watches notify on; an endpoint's device names the client that made it.
-- compatible: devices  the new columns' checks hold for every row the last release writes (the
-- default channel, no client).
ALTER TABLE devices
    ADD COLUMN channel text NOT NULL DEFAULT 'web_push' CHECK (channel IN ('web_push', 'webhook')),
    ADD COLUMN client_id uuid REFERENCES api_clients (id);

ALTER TABLE push_subscriptions
    ADD COLUMN channel text NOT NULL DEFAULT 'web_push' CHECK (channel IN ('web_push', 'webhook')),
    ADD COLUMN description text CHECK (length(description) <= 500),
    ADD COLUMN secret text,
    ADD COLUMN previous_secret text,
    ADD COLUMN previous_until timestamptz;
-- compatible: push_subscriptions.p256dh  a webhook has no keys; the last release reads a row
-- without them as no subscription (its watches' rows are withheld, subscription_inactive), and
-- only this release registers webhook endpoints.
ALTER TABLE push_subscriptions ALTER COLUMN p256dh DROP NOT NULL;
-- compatible: push_subscriptions.auth  as p256dh.
ALTER TABLE push_subscriptions ALTER COLUMN auth DROP NOT NULL;
-- compatible: push_subscriptions  the new check holds for every row the last release writes
-- (web_push, with keys, without a secret).
ALTER TABLE push_subscriptions ADD CONSTRAINT push_subscriptions_channel_fields CHECK (
    CASE channel
        WHEN 'web_push' THEN p256dh IS NOT NULL AND auth IS NOT NULL AND secret IS NULL
        ELSE secret IS NOT NULL AND p256dh IS NULL AND auth IS NULL
    END);

-- compatible: watches  the channel check only widens; the last release writes web_push only.
ALTER TABLE watches DROP CONSTRAINT watches_channel_check;
ALTER TABLE watches ADD CONSTRAINT watches_channel_check CHECK (channel IN ('web_push', 'webhook'));
-- compatible: outbox  as watches: the channel check only widens.
ALTER TABLE outbox DROP CONSTRAINT outbox_channel_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_channel_check CHECK (channel IN ('web_push', 'webhook'));

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_api') THEN
        GRANT SELECT, INSERT, UPDATE ON api_clients TO tidings_api;
    END IF;
END
$$;
