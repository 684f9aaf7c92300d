-- A job's priority comes from two topics, its submission and its priority changes
-- (jobs.priorities), which a projector may consume in either order: the change wins whenever
-- it is folded, so the row says when the priority last changed.
ALTER TABLE jobs ADD COLUMN priority_changed_at timestamptz;
