-- The digest claim's index. Every second each dispatcher asks which readers have a digest due
-- (held `digest`, at their release); without an index of their own it read every due row of the
-- outbox and kept the digest ones, so its cost grew with the backlog: 33 ms a call with 40,000
-- rows due (bench dispatcher), every second, most when the dispatchers are catching up. Indexed
-- by release time, it reads only the digest rows that are due.
-- compatible: outbox  `ON ONLY` on the partitioned outbox builds nothing here: the index is
-- declared on the parent alone (instantly, invalid until each partition has its own), and
-- `migrate` then builds each partition's own without a lock on writes and attaches it
-- (schema::complete_partitioned_indexes), so writes to the outbox never wait for a build.
-- Partitions created later get theirs when they are created. The last release never reads it.
CREATE INDEX IF NOT EXISTS outbox_digests_due ON ONLY outbox (next_attempt_at)
    WHERE held = 'digest' AND status IN ('pending', 'retry');
