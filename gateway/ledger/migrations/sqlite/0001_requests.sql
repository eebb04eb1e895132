-- One row per request (the schema of ledgers written before migrations were versioned).
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY,
    time REAL NOT NULL, request_id TEXT NOT NULL, api_key_name TEXT, route TEXT NOT NULL,
    endpoint TEXT NOT NULL, stream INTEGER NOT NULL, backend TEXT, upstream_model TEXT,
    prompt_tokens INTEGER NOT NULL, cached_prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, reasoning_tokens INTEGER NOT NULL, usage_source TEXT,
    cost_usd REAL NOT NULL, cost_basis TEXT, reserved_usd REAL,
    ttft_s REAL, first_answer_s REAL, decode_tokens_per_s REAL, duration_s REAL,
    status TEXT NOT NULL, error_type TEXT, attempts INTEGER NOT NULL, decision_reason TEXT
);
CREATE INDEX IF NOT EXISTS requests_time ON requests (time);
