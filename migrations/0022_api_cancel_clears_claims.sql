-- An operator's cancel (the api) ends a row as every transition does, with its claim cleared:
-- the api may now set claimed_until too, beside 0013's status, reason, last_error, finished_at.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_api') THEN
        GRANT UPDATE (claimed_until) ON outbox TO tidings_api;
    END IF;
END
$$;
