-- The detector keeps its shard's watches and their baselines in memory and, each scan, reads only
-- the rows written since its previous read (re-reading every watch every scan was most of the
-- detector's cost, and a visible share of Postgres').
--
-- Each row carries the id of the transaction that last wrote it (xid8: 64 bits, never wraps). A
-- read also takes pg_snapshot_xmin(pg_current_snapshot()): every transaction below that id had
-- finished when the read's snapshot was taken, so whatever it wrote was visible to that read.
-- The next read asks for changed_xid >= that id, and so sees every later write, including one
-- whose transaction started before the previous read and committed after it. A timestamp could
-- not promise that: now() is taken when a transaction starts, not when it commits.
--
-- A trigger sets the mark, so no writer (api, dispatcher, detector, an operator's psql) can
-- forget it. Devices have no mark: a device's time zone never changes, and removing a device
-- removes its watches in the same statement (api), which marks them.
ALTER TABLE watches ADD COLUMN changed_xid xid8 NOT NULL DEFAULT pg_current_xact_id();
ALTER TABLE baselines ADD COLUMN changed_xid xid8 NOT NULL DEFAULT pg_current_xact_id();

CREATE FUNCTION mark_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.changed_xid := pg_current_xact_id();
    RETURN NEW;
END
$$;
CREATE TRIGGER watches_changed BEFORE INSERT OR UPDATE ON watches
    FOR EACH ROW EXECUTE FUNCTION mark_changed();
CREATE TRIGGER baselines_changed BEFORE INSERT OR UPDATE ON baselines
    FOR EACH ROW EXECUTE FUNCTION mark_changed();

CREATE INDEX watches_changed ON watches (changed_xid);
CREATE INDEX baselines_changed ON baselines (changed_xid);
