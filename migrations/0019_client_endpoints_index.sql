-- Operators list API clients with how many endpoints each registered (GET /v1/admin/clients):
-- only endpoint devices name a client, so a partial index stays as small as their number.
CREATE INDEX devices_client ON devices (client_id) WHERE client_id IS NOT NULL;
