-- What a device showed for a notification (docs/design.md, "True on the screen"): its service
-- worker asks the api whether the notification still holds before it shows it, then reports
-- what it showed: `as_sent`, `updated` (still true at another value), `corrected` (what changed)
-- or `as_of` (the api could not be asked in time). Best effort: a device that never reports
-- leaves no row. The last report wins.
--
-- Not on the outbox row, which is terminal (`sent`) by then and which the guard keeps as it
-- ended. The dispatcher's retention round deletes the reports of days the outbox no longer
-- holds, so they live as long as their notification.

CREATE TABLE notifications_shown (
    outbox_id  uuid PRIMARY KEY,
    dedup_day  date NOT NULL,
    device_id  uuid NOT NULL,
    shown      text NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notifications_shown_day ON notifications_shown (dedup_day);

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_api') THEN
        GRANT SELECT, INSERT, UPDATE ON notifications_shown TO tidings_api;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        GRANT SELECT, DELETE ON notifications_shown TO tidings_dispatcher;
    END IF;
END
$$;
