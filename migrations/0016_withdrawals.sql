-- Withdrawals (docs/design.md, "True on the screen"): a sent notification whose condition stops
-- holding before its valid_until is followed by one outbox row that replaces it on the screen.
--
-- outbox.withdraws names the sent row a withdrawal row replaces; its `trigger` is that row's key
-- behind `withdraw:` and its dedup day that row's, so the unique key allows one per sent row.
--
-- The detector has no access to the outbox: it learns what a sent notification stated from the
-- baseline the send left, which now also keeps the row's dedup day, until when it was current and
-- when the value it stated was observed and the baseline it was decided against (all NULL once a withdrawal was sent, and for baselines
-- written before this release, which are never withdrawn).
--
-- watches.withdraw turns withdrawals off for one watch.

ALTER TABLE outbox ADD COLUMN withdraws uuid;

ALTER TABLE baselines
    ADD COLUMN dedup_day date,
    ADD COLUMN observed_at timestamptz,
    ADD COLUMN valid_until timestamptz,
    ADD COLUMN decided_price bigint,
    ADD COLUMN decided_reference bigint,
    ADD COLUMN decided_in_stock boolean;

ALTER TABLE watches ADD COLUMN withdraw boolean NOT NULL DEFAULT true;
