-- Salus lanes in the read models (issue 20; hivemux.projection.lanes, hivemux.store.lanes).
-- A lane GPU (the cell allocator's internal job lane-gpu:<vc>:<n>, a 1-GPU cell of its VC) is
-- a jobs row of kind 'lane-gpu' with its binding's VC and priority class: vc_cells and usage
-- count its GPU as the VC's; the jobs list and the job counts leave it out.

-- Each lane job's latest lane (jobs.lifecycle `bound` carrying lane_id): the lane GPU, node,
-- GPU, lane, L_j, iteration policy and every input of the placement (Σ P_i + Σ L_j vs C).
CREATE TABLE lane_jobs (
    job_id        text PRIMARY KEY,
    lane_gpu      text NOT NULL,
    node_id       text NOT NULL,
    gpu_id        text NOT NULL,
    lane_id       text NOT NULL,
    lane_size_mib double precision,
    policy        text NOT NULL,
    inputs        jsonb NOT NULL DEFAULT '{}',
    bound_at      timestamptz NOT NULL
);
CREATE INDEX lane_jobs_gpu ON lane_jobs (gpu_id, lane_id, job_id);

-- Each job's progress (executor.reports): the most iterations any report said (order-independent
-- across the nodes' partitions) and the latest report's throughput, node and GPUs.
CREATE TABLE job_progress (
    job_id           text PRIMARY KEY,
    iterations_done  bigint NOT NULL,
    iterations_total bigint NOT NULL,
    throughput_it_s  double precision NOT NULL,
    node_id          text NOT NULL,
    gpu_ids          jsonb NOT NULL DEFAULT '[]',
    reported_at      timestamptz NOT NULL
);

-- vcs (0003): jobs counts users' jobs only; a lane GPU's GPUs still count as used, and the
-- lane GPUs are counted apart (appended column).
CREATE OR REPLACE VIEW vcs AS
SELECT j.vc, j.state, count(*) FILTER (WHERE jobs.kind IS DISTINCT FROM 'lane-gpu')::int AS jobs,
       sum(j.guaranteed)::int AS guaranteed_gpus_used, sum(j.opportunistic)::int AS opportunistic_gpus_used,
       count(*) FILTER (WHERE jobs.kind = 'lane-gpu')::int AS lane_gpus
FROM job_gpus AS j JOIN jobs USING (job_id) WHERE j.vc IS NOT NULL
GROUP BY j.vc, j.state;
