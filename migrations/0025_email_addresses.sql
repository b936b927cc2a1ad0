-- no-transaction
-- A bounce report names addresses (POST /v1/email/bounces): their active email subscriptions are
-- found by this partial index, as small as the number of email devices. Built CONCURRENTLY, so
-- writes to push_subscriptions go on during the build.
CREATE INDEX CONCURRENTLY IF NOT EXISTS push_subscriptions_email ON push_subscriptions (endpoint) WHERE channel = 'email' AND active;
