-- vc_cells (0006) with the GPUs its lane GPUs hold now appended (issue 20; hivemux.projection.lanes):
-- they are already in guaranteed_used / opportunistic_used by their priority class; this says how
-- many of those GPUs host Salus lanes (CREATE OR REPLACE VIEW keeps the columns before).
CREATE OR REPLACE VIEW vc_cells AS
WITH used AS (
    SELECT vc, sum(guaranteed) AS guaranteed, sum(opportunistic) AS opportunistic,
           count(*) FILTER (WHERE state = 'waiting') AS waiting
    FROM job_gpus WHERE vc IS NOT NULL GROUP BY vc
), lanes AS (
    SELECT j.vc, sum(g.guaranteed + g.opportunistic) AS gpus
    FROM job_gpus AS g JOIN jobs AS j USING (job_id) WHERE j.kind = 'lane-gpu' AND j.vc IS NOT NULL GROUP BY j.vc
)
SELECT coalesce(q.vc, u.vc) AS vc,
       coalesce(q.guaranteed_gpus, 0)::int AS guaranteed_gpus,
       coalesce(u.guaranteed, 0)::int AS guaranteed_used,
       greatest(coalesce(q.guaranteed_gpus, 0) - coalesce(u.guaranteed, 0), 0)::int AS guaranteed_free,
       coalesce(u.opportunistic, 0)::int AS opportunistic_used,
       coalesce(u.waiting, 0)::int AS waiting_jobs,
       coalesce((SELECT b.bad_gpus FROM vc_bad_gpus AS b WHERE b.vc = coalesce(q.vc, u.vc)), 0)::int AS bad_gpus,
       coalesce((SELECT l.gpus FROM lanes AS l WHERE l.vc = coalesce(q.vc, u.vc)), 0)::int AS lane_gpus
FROM vc_quotas AS q FULL JOIN used AS u ON q.vc = u.vc;
