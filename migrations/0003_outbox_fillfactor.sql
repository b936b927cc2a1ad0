-- A claim sets `claimed_until` on every row it takes, and it takes rows in insertion order, so it
-- updates whole pages at once. At fill factor 80 a page has room for new versions of only about a
-- quarter of its rows: the rest were not HOT and wrote an entry into every index. At 50 each row's
-- claimed version fits beside it. Applies to pages written from now on.
ALTER TABLE outbox SET (fillfactor = 50);
