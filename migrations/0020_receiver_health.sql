-- A webhook receiver judged and paced (docs/webhooks.md, tidings_domain::receiver): the breaker
-- opens once an endpoint's failures have lasted (failing_since), doubles its pause per opening
-- (circuit_opens) and sends one probe at a time (circuit_probing); a receiver that asks to slow
-- down gets a pace (pace_per_second rows, none before paced_until), never a failure.

-- compatible: push_subscriptions  the new columns' checks hold for every row (their defaults).
ALTER TABLE push_subscriptions
    ADD COLUMN failing_since timestamptz,
    ADD COLUMN circuit_opens integer NOT NULL DEFAULT 0 CHECK (circuit_opens >= 0),
    ADD COLUMN circuit_probing boolean NOT NULL DEFAULT false,
    ADD COLUMN pace_per_second double precision CHECK (pace_per_second > 0),
    ADD COLUMN paced_until timestamptz;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        GRANT UPDATE (failing_since, circuit_opens, circuit_probing, pace_per_second, paced_until)
            ON push_subscriptions TO tidings_dispatcher;
    END IF;
END
$$;
