-- no-transaction
-- Operators list API clients with how many endpoints each registered (GET /v1/admin/clients):
-- only endpoint devices name a client, so a partial index stays as small as their number.
-- Built CONCURRENTLY, so writes to devices go on during the build; a build cut short leaves an
-- invalid index, which `migrate` rebuilds (schema::repair_indexes).
CREATE INDEX CONCURRENTLY IF NOT EXISTS devices_client ON devices (client_id) WHERE client_id IS NOT NULL;
