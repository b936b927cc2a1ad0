-- The results loop upserts a baseline with every `sent` row. Its foreign key made each upsert
-- lock the watch row (FOR KEY SHARE), which rewrites that row's header and logs it: a visible
-- share of the results stage's Postgres time. A baseline is only ever written for an outbox row
-- whose watch ingest has checked, and watches are only soft-deleted, so the reference cannot
-- dangle; the outbox made the same choice.
ALTER TABLE baselines DROP CONSTRAINT baselines_watch_id_fkey;
