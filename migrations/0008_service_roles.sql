-- A role per service with only what it needs (docs/security.md). They are group roles (NOLOGIN):
-- each service logs in as a user that is a member of its role.
--
-- Roles belong to the whole Postgres cluster, and creating them needs CREATEROLE. When the user
-- running the migrations has it (a Postgres you run yourself, the local stack), they are created
-- here; on a managed Postgres where it does not, create them first as an administrator:
--     CREATE ROLE tidings_api NOLOGIN; CREATE ROLE tidings_dispatcher NOLOGIN;
--     CREATE ROLE tidings_detector NOLOGIN;
-- The grants below go to the roles that exist. The pusher has no database at all.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['tidings_api', 'tidings_dispatcher', 'tidings_detector'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN insufficient_privilege THEN
                RAISE NOTICE 'role % does not exist and cannot be created here: create it, then grant as in 0008_service_roles.sql', r;
            END;
        END IF;
    END LOOP;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_api') THEN
        -- Devices, their subscriptions and watches; idempotency records; the history (read) and
        -- an operator replay (a new row). It never changes an outbox row.
        GRANT SELECT, INSERT, UPDATE ON devices, push_subscriptions, watches TO tidings_api;
        GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys TO tidings_api;
        GRANT SELECT, INSERT ON outbox TO tidings_api;
        GRANT SELECT ON _sqlx_migrations TO tidings_api;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        -- The outbox and the baselines it moves; reads what a re-check and a push need; marks a
        -- subscription gone. Not a device's token hash.
        GRANT SELECT, INSERT, UPDATE ON outbox, baselines TO tidings_dispatcher;
        GRANT SELECT ON watches TO tidings_dispatcher;
        GRANT SELECT (id, time_zone, created_at, removed_at) ON devices TO tidings_dispatcher;
        GRANT SELECT, UPDATE ON push_subscriptions TO tidings_dispatcher;
        GRANT SELECT ON _sqlx_migrations TO tidings_dispatcher;
    END IF;

    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_detector') THEN
        -- Reads watches and baselines, records what a scan saw on the watch. No outbox at all.
        GRANT SELECT, UPDATE ON watches TO tidings_detector;
        GRANT SELECT ON baselines TO tidings_detector;
        GRANT SELECT (id, time_zone, created_at, removed_at) ON devices TO tidings_detector;
        GRANT SELECT ON _sqlx_migrations TO tidings_detector;
    END IF;
END
$$;
