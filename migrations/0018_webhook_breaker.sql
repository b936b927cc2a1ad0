-- A circuit breaker per webhook endpoint (docs/webhooks.md): the dispatcher counts the results
-- of an endpoint's attempts in a row that failed, and after enough of them holds its rows back
-- until circuit_open_until, so a failing receiver costs no requests meanwhile and says so in its
-- status. A delivery closes the circuit.

-- compatible: push_subscriptions  the new column's check holds for every row (its default).
ALTER TABLE push_subscriptions
    ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    ADD COLUMN circuit_open_until timestamptz;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        GRANT UPDATE (consecutive_failures, circuit_open_until) ON push_subscriptions
            TO tidings_dispatcher;
    END IF;
END
$$;
