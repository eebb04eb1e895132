-- One row per request: the SQLite ledger's first schema, in PostgreSQL types.
CREATE TABLE IF NOT EXISTS requests (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    time DOUBLE PRECISION NOT NULL, request_id TEXT NOT NULL, api_key_name TEXT, route TEXT NOT NULL,
    endpoint TEXT NOT NULL, stream BOOLEAN NOT NULL, backend TEXT, upstream_model TEXT,
    prompt_tokens BIGINT NOT NULL, cached_prompt_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL, reasoning_tokens BIGINT NOT NULL, usage_source TEXT,
    cost_usd DOUBLE PRECISION NOT NULL, cost_basis TEXT, reserved_usd DOUBLE PRECISION,
    ttft_s DOUBLE PRECISION, first_answer_s DOUBLE PRECISION, decode_tokens_per_s DOUBLE PRECISION,
    duration_s DOUBLE PRECISION,
    status TEXT NOT NULL, error_type TEXT, attempts INTEGER NOT NULL, decision_reason TEXT
);
CREATE INDEX IF NOT EXISTS requests_time ON requests (time);
