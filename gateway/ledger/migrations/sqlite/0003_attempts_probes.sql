-- What a request used and went through: the prefill share of a pool's cost, time waiting for a free
-- candidate, each attempt in order; and synthetic probes, in a table of their own (no route, no key).
ALTER TABLE requests ADD COLUMN prefill_cost_usd REAL;
ALTER TABLE requests ADD COLUMN queued_s REAL NOT NULL DEFAULT 0;
ALTER TABLE requests ADD COLUMN attempt_log TEXT NOT NULL DEFAULT '';
ALTER TABLE requests ADD COLUMN probe INTEGER NOT NULL DEFAULT 0;
CREATE TABLE probes AS SELECT * FROM requests WHERE 0;
CREATE INDEX probes_backend_time ON probes (backend, time);
CREATE UNIQUE INDEX probes_row_key ON probes (row_key);
