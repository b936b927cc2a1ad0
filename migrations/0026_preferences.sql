-- A reader's preferences: when notifications wait (quiet hours, a cap per window), as
-- the JSON object `tidings_domain::preferences::PreferencesSpec` reads and the api checks before
-- writing (`{}`: nothing waits). A watch's own, when set, replace its device's whole; NULL: the
-- device's. An urgent watch's notifications never wait.

ALTER TABLE devices ADD COLUMN preferences jsonb NOT NULL DEFAULT '{}';
ALTER TABLE watches ADD COLUMN preferences jsonb;
ALTER TABLE watches ADD COLUMN urgent boolean NOT NULL DEFAULT false;

-- Why a pending row waits past its detection (the dispatcher sets it with the row's
-- next_attempt_at, its release): the reader's quiet hours or cap. Kept once it ends, so what was
-- released or dropped at release can be told by why it was held.
-- compatible: outbox  the new column's check holds for every row the last release writes (none
-- set).
ALTER TABLE outbox ADD COLUMN held text CHECK (held IN ('quiet_hours', 'cap', 'digest'));

-- When a reader changes the preferences a row waits by, the api makes the device's (or the
-- watch's) held rows due at once, to be judged by the new ones. Through this function only: the
-- api may not move a row's next attempt otherwise.
CREATE FUNCTION tidings_release_held(p_device uuid, p_watch uuid) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH released AS (
        UPDATE outbox SET next_attempt_at = now()
        WHERE device_id = p_device AND (p_watch IS NULL OR watch_id = p_watch)
          AND held IS NOT NULL AND status IN ('pending', 'retry') AND next_attempt_at > now()
        RETURNING 1)
    SELECT count(*) FROM released
$$;
REVOKE ALL ON FUNCTION tidings_release_held(uuid, uuid) FROM PUBLIC;

-- The dispatcher decides whether a row waits (it reads watches whole already).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        GRANT SELECT (preferences) ON devices TO tidings_dispatcher;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_api') THEN
        GRANT EXECUTE ON FUNCTION tidings_release_held(uuid, uuid) TO tidings_api;
    END IF;
END
$$;
