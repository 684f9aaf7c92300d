-- The failures a job's decider counted against its max_restarts so far (issue 29 item 7,
-- `hivemux.jobs.limits`): the largest ``restarts`` input of the cell allocator's or the matcher's
-- lifecycle events for the job; 0 for rows folded before this migration or never restarted.
ALTER TABLE jobs ADD COLUMN restarts int NOT NULL DEFAULT 0;
