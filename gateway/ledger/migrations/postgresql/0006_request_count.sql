-- A flood of refused requests is folded into one row per minute, reason, key, route and door past
-- their own bound (ledger/refused.py), so that row counts the requests it stands for; every other row
-- counts 1. Reports sum this column where they counted rows.
ALTER TABLE requests ADD COLUMN request_count INTEGER NOT NULL DEFAULT 1;
ALTER TABLE probes ADD COLUMN request_count INTEGER NOT NULL DEFAULT 1;
