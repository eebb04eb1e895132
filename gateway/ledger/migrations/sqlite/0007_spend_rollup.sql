-- Spend reports at volume: every request row's sums kept per hour and per day (`hours` 1 or 24) and per
-- grouping (route, backend, key, replica, user; refused requests by reason), by a trigger in the same
-- transaction as the row, so a report over a month reads whole days, the hours of its partial days and
-- at most an hour of raw rows at each end, and its totals are a full scan's. `bucket` counts `hours`
-- from the epoch; a row's hour is the largest h with h * 3600 <= time (CAST truncates; the second term
-- takes back a division that rounded up across the boundary): exactly the rows a `time < h * 3600`
-- comparison puts before it, so a report adds a partial hour's raw rows without overlap. `name` is ''
-- with `name_null` 1 where the row had NULL (no key is not the key ''). A row counts `request_count`
-- requests (a folded flood of refusals, migration 6), as the full-scan reports do.
CREATE TABLE spend_rollup (
    dimension TEXT NOT NULL, hours INTEGER NOT NULL, bucket INTEGER NOT NULL,
    name TEXT NOT NULL, name_null INTEGER NOT NULL,
    cost_basis TEXT NOT NULL,
    requests INTEGER NOT NULL, errors INTEGER NOT NULL, refused INTEGER NOT NULL, fallbacks INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL, cached_prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, reasoning_tokens INTEGER NOT NULL, cost_usd REAL NOT NULL,
    PRIMARY KEY (dimension, hours, bucket, name, name_null, cost_basis)
) WITHOUT ROWID;
-- What `gateway ledger prune` removed: rows before `before` (an hour's start) are gone from
-- `requests`, still summed in spend_rollup.
CREATE TABLE ledger_pruned (before REAL NOT NULL, earliest REAL, rows INTEGER NOT NULL, pruned_at REAL NOT NULL);
CREATE TABLE spend_dimensions (dimension TEXT PRIMARY KEY);
INSERT INTO spend_dimensions VALUES ('route'), ('backend'), ('key'), ('replica'), ('user'), ('refused');
CREATE TABLE spend_spans (hours INTEGER PRIMARY KEY);
INSERT INTO spend_spans VALUES (1), (24);
-- A ledger that already has rows: sum them in once.
INSERT INTO spend_rollup
SELECT dimension, 1, CAST(time / 3600 AS INTEGER) - (CAST(time / 3600 AS INTEGER) * 3600 > time),
    coalesce(name, ''), name IS NULL, coalesce(cost_basis, ''),
    sum(request_count), sum((status <> 'ok') * request_count), sum((status = 'refused') * request_count),
    sum(attempts > 1),
    sum(prompt_tokens), sum(cached_prompt_tokens), sum(completion_tokens), sum(reasoning_tokens), sum(cost_usd)
FROM (
    SELECT d.dimension, CASE d.dimension WHEN 'route' THEN r.route WHEN 'backend' THEN r.backend
        WHEN 'key' THEN r.api_key_name WHEN 'replica' THEN r.replica WHEN 'user' THEN r.user_hash
        ELSE coalesce(r.error_type, '') END AS name, r.*
    FROM requests r JOIN spend_dimensions d ON d.dimension <> 'refused' OR r.status = 'refused'
)
GROUP BY 1, 2, 3, 4, 5, 6;
-- The days, from the hours just summed (a day is 24 whole hours).
INSERT INTO spend_rollup
SELECT dimension, 24, bucket / 24, name, name_null, cost_basis, sum(requests), sum(errors), sum(refused),
    sum(fallbacks), sum(prompt_tokens), sum(cached_prompt_tokens), sum(completion_tokens),
    sum(reasoning_tokens), sum(cost_usd)
FROM spend_rollup WHERE hours = 1
GROUP BY 1, 2, 3, 4, 5, 6;
CREATE TRIGGER requests_spend_rollup AFTER INSERT ON requests BEGIN
    INSERT INTO spend_rollup
    SELECT d.dimension, s.hours,
        (CAST(NEW.time / 3600 AS INTEGER) - (CAST(NEW.time / 3600 AS INTEGER) * 3600 > NEW.time)) / s.hours,
        coalesce(d.name, ''), d.name IS NULL, coalesce(NEW.cost_basis, ''),
        NEW.request_count, (NEW.status <> 'ok') * NEW.request_count, (NEW.status = 'refused') * NEW.request_count,
        NEW.attempts > 1, NEW.prompt_tokens,
        NEW.cached_prompt_tokens, NEW.completion_tokens, NEW.reasoning_tokens, NEW.cost_usd
    FROM (
        SELECT dimension, CASE dimension WHEN 'route' THEN NEW.route WHEN 'backend' THEN NEW.backend
            WHEN 'key' THEN NEW.api_key_name WHEN 'replica' THEN NEW.replica WHEN 'user' THEN NEW.user_hash
            ELSE coalesce(NEW.error_type, '') END AS name
        FROM spend_dimensions WHERE dimension <> 'refused' OR NEW.status = 'refused'
    ) AS d CROSS JOIN spend_spans AS s WHERE true
    ON CONFLICT (dimension, hours, bucket, name, name_null, cost_basis) DO UPDATE SET
        requests = requests + excluded.requests, errors = errors + excluded.errors,
        refused = refused + excluded.refused, fallbacks = fallbacks + excluded.fallbacks,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens,
        cached_prompt_tokens = cached_prompt_tokens + excluded.cached_prompt_tokens,
        completion_tokens = completion_tokens + excluded.completion_tokens,
        reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens,
        cost_usd = cost_usd + excluded.cost_usd;
END;
-- The reports group from the rollup now, and read raw rows only by time: the per-grouping indexes of
-- migrations 2 and 4 would only cost every insert (a fifth of the database's CPU per written row).
DROP INDEX requests_route_time;
DROP INDEX requests_backend_time;
DROP INDEX requests_key_time;
DROP INDEX requests_replica_time;
DROP INDEX requests_user_time;
DROP INDEX requests_status_time;
