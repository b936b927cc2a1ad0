-- Email, a third channel (docs/email.md). An email device's one subscription is its address,
-- written `mailto:<address>` in endpoint. Its secret (sealed like a webhook's) keys the links
-- each mail carries: the page that shows whether the notification still holds, and the
-- one-click unsubscribe. Nothing is mailed to an address until its owner opens the
-- confirmation link: until then the subscription is `unconfirmed` and its rows wait.

-- compatible: devices  the channel check only widens; the last release writes no email.
ALTER TABLE devices DROP CONSTRAINT devices_channel_check;
ALTER TABLE devices ADD CONSTRAINT devices_channel_check
    CHECK (channel IN ('web_push', 'webhook', 'email'));
-- compatible: push_subscriptions  as devices: the channel check only widens.
ALTER TABLE push_subscriptions DROP CONSTRAINT push_subscriptions_channel_check;
ALTER TABLE push_subscriptions ADD CONSTRAINT push_subscriptions_channel_check
    CHECK (channel IN ('web_push', 'webhook', 'email'));
-- compatible: watches  as devices: the channel check only widens.
ALTER TABLE watches DROP CONSTRAINT watches_channel_check;
ALTER TABLE watches ADD CONSTRAINT watches_channel_check
    CHECK (channel IN ('web_push', 'webhook', 'email'));
-- compatible: outbox  as devices: the channel check only widens.
ALTER TABLE outbox DROP CONSTRAINT outbox_channel_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_channel_check
    CHECK (channel IN ('web_push', 'webhook', 'email'));

-- A subscription no mail may go to yet (only email subscriptions are ever unconfirmed).
ALTER TABLE push_subscriptions ADD COLUMN unconfirmed boolean NOT NULL DEFAULT false;

-- Confirmation links: random, single-use, expiring. Only the token's hash is kept. Rows are
-- also the record the rate limits count: per address and per domain, in the last day. They go
-- with their subscription when removed devices are purged.
CREATE TABLE email_confirmations (
    token_hash      bytea PRIMARY KEY CHECK (octet_length(token_hash) = 32),
    subscription_id uuid NOT NULL REFERENCES push_subscriptions (id) ON DELETE CASCADE,
    address         text NOT NULL,
    domain          text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    used_at         timestamptz
);
CREATE INDEX email_confirmations_address ON email_confirmations (address, created_at);
CREATE INDEX email_confirmations_domain ON email_confirmations (domain, created_at);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_api') THEN
        GRANT SELECT, INSERT, UPDATE ON email_confirmations TO tidings_api;
    END IF;
END
$$;
