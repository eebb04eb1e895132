-- Cache-aware routing: the cached prompt tokens the prefix index predicted on the backend that
-- answered, beside the cached_prompt_tokens it reported, so the prediction's error can be audited.
ALTER TABLE requests ADD COLUMN predicted_cached_tokens INTEGER;
ALTER TABLE probes ADD COLUMN predicted_cached_tokens INTEGER;
