-- SQLite's migration 8 moves its spend rollup from a per-row trigger to one statement per written
-- batch. PostgreSQL's trigger is per statement already (migration 7): nothing changes here; the
-- version is kept in step so both dialects name the same schema by the same number.
SELECT 1;
