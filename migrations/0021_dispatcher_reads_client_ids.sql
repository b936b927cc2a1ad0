-- The dispatcher's gauges of webhook endpoints' health (tidings_webhook_*) find the endpoints
-- through devices_client, the partial index of API clients' devices, rather than reading every
-- push subscription: it may read which client a device belongs to (not its token).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        GRANT SELECT (client_id) ON devices TO tidings_dispatcher;
    END IF;
END
$$;
