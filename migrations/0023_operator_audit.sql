-- Who did what on the operator routes (GET /v1/admin/audit, `tidings audit`). The api writes a
-- row before it acts (the action, the operator's name, what it named) and completes it after
-- (the answer's status, how many rows or messages it changed), so an action cut short still
-- shows who started it. The dispatcher's retention round deletes rows older than
-- TIDINGS_AUDIT_RETENTION. Nothing else changes a row: operators cannot edit their trail.

CREATE TABLE operator_actions (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    operator text NOT NULL,
    action   text NOT NULL,
    target   jsonb NOT NULL,
    dry_run  boolean NOT NULL DEFAULT false,
    status   smallint,
    rows     bigint
);
CREATE INDEX operator_actions_at ON operator_actions (at);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_api') THEN
        GRANT SELECT, INSERT ON operator_actions TO tidings_api;
        GRANT UPDATE (status, rows) ON operator_actions TO tidings_api;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        GRANT SELECT, DELETE ON operator_actions TO tidings_dispatcher;
    END IF;
END
$$;
