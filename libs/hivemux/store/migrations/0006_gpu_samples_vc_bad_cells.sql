-- Each GPU's last sample (hivemux.projection GpuHealthChanged.sample_at): the time and the
-- SysMonitor metrics of its latest metric-driven health transition. gpu.health carries the
-- samples that changed a state; the projector does not fold the 1 Hz telemetry.
ALTER TABLE gpus ADD COLUMN sample_at timestamptz;
ALTER TABLE gpus ADD COLUMN sample_metrics jsonb NOT NULL DEFAULT '{}';

-- Bad hardware as the cell allocator judges it (hivemux.cells.bad_hardware): a node is bad
-- while any one of its GPUs is Disabled.
CREATE VIEW bad_nodes AS
SELECT DISTINCT node_id FROM gpus WHERE health = 'Disabled' AND node_id IS NOT NULL;

-- Per VC, the GPUs its jobs' bound pods hold on bad nodes (the cells HiveD shows the VC as bad).
CREATE VIEW vc_bad_gpus AS
SELECT jobs.vc, sum(jsonb_array_length(pod -> 'gpu_ids'))::int AS bad_gpus
FROM jobs, jsonb_each(jobs.binding) AS b(name, pod)
WHERE jobs.vc IS NOT NULL
  AND EXISTS (SELECT 1 FROM jsonb_array_elements_text(pod -> 'node_ids') AS n(node_id) JOIN bad_nodes USING (node_id))
GROUP BY jobs.vc;

-- vc_cells (0003) with the bad GPUs appended (CREATE OR REPLACE VIEW keeps the columns before).
CREATE OR REPLACE VIEW vc_cells AS
WITH used AS (
    SELECT vc, sum(guaranteed) AS guaranteed, sum(opportunistic) AS opportunistic,
           count(*) FILTER (WHERE state = 'waiting') AS waiting
    FROM job_gpus WHERE vc IS NOT NULL GROUP BY vc
)
SELECT coalesce(q.vc, u.vc) AS vc,
       coalesce(q.guaranteed_gpus, 0)::int AS guaranteed_gpus,
       coalesce(u.guaranteed, 0)::int AS guaranteed_used,
       greatest(coalesce(q.guaranteed_gpus, 0) - coalesce(u.guaranteed, 0), 0)::int AS guaranteed_free,
       coalesce(u.opportunistic, 0)::int AS opportunistic_used,
       coalesce(u.waiting, 0)::int AS waiting_jobs,
       coalesce((SELECT b.bad_gpus FROM vc_bad_gpus AS b WHERE b.vc = coalesce(q.vc, u.vc)), 0)::int AS bad_gpus
FROM vc_quotas AS q FULL JOIN used AS u ON q.vc = u.vc;
