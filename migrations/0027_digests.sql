-- Digests: a reader's held notifications go out together as one message at the digest time.
-- The message is sent for its lowest-id member, the leader; every member row names the leader
-- here (the leader itself included) and takes the leader's result as its own. Set when the
-- rows are marked `sending`; kept after, so history and replay can tell which message carried a
-- row.
-- compatible: outbox  a new nullable column the last release neither reads nor writes.
ALTER TABLE outbox ADD COLUMN digest_of uuid;
