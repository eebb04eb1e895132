-- Many replicas, one ledger: which replica wrote a row, and a key that makes a retried batch idempotent.
ALTER TABLE requests ADD COLUMN replica TEXT;
ALTER TABLE requests ADD COLUMN row_key TEXT;
CREATE UNIQUE INDEX requests_row_key ON requests (row_key);
-- The reports group by one of these over a time window.
CREATE INDEX requests_route_time ON requests (route, time);
CREATE INDEX requests_backend_time ON requests (backend, time);
CREATE INDEX requests_key_time ON requests (api_key_name, time);
CREATE INDEX requests_replica_time ON requests (replica, time);
