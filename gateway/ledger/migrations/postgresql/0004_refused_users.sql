-- Requests the gateway refused (status 'refused', the reason in error_type) are counted by reason over a
-- time window; and a keyed hash of the client's user id, for per-user spend (ledger.user: hashed).
ALTER TABLE requests ADD COLUMN user_hash TEXT;
ALTER TABLE probes ADD COLUMN user_hash TEXT;
CREATE INDEX requests_user_time ON requests (user_hash, time);
CREATE INDEX requests_status_time ON requests (status, time);
