-- Narrower than 0008: the detector changes only what a scan records on a watch, and the
-- dispatcher only marks a subscription gone; neither may rewrite a watch's trigger or a
-- subscription's endpoint and keys.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_detector') THEN
        REVOKE UPDATE ON watches FROM tidings_detector;
        GRANT UPDATE (last_in_stock, reference_price) ON watches TO tidings_detector;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        REVOKE UPDATE ON push_subscriptions FROM tidings_dispatcher;
        GRANT UPDATE (active, deactivated_at, deactivation_reason) ON push_subscriptions
            TO tidings_dispatcher;
    END IF;
END
$$;
