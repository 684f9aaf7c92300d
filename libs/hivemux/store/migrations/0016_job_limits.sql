-- A job's limits as submitted (issue 29 item 7): max_runtime_s, queue_timeout_s, max_restarts,
-- for `jobs describe`, the API and the console; NULL for rows folded before this migration.
ALTER TABLE jobs ADD COLUMN limits jsonb;
