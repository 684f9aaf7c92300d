-- Read models (ARCHITECTURE.md "The log as the system of record"): tables the projector folds
-- from the topics (hivemux.projection, hivemux.store.read_models). Nobody else writes them;
-- `hivemux projector rebuild` truncates them and folds again. States are text, so a new job
-- state needs no migration.

-- The projector's position: the next offset to read per topic partition, written in the same
-- transaction as the rows the records before it produced (eventsourcing's tracking records).
CREATE TABLE projector_offsets (
    topic       text NOT NULL,
    partition   int NOT NULL,
    next_offset bigint NOT NULL,
    PRIMARY KEY (topic, partition)
);

CREATE TABLE jobs (
    job_id        text PRIMARY KEY,
    state         text NOT NULL DEFAULT 'submitted',
    vc            text,
    kind          text,
    priority      text,                            -- HiveD's class: guaranteed or opportunistic
    priority_value int,                            -- HiveD's priority within it (-1, 0..1000)
    pods          int,
    gpus          int,
    placement     jsonb,                          -- the matcher's current placement (offline jobs)
    binding       jsonb NOT NULL DEFAULT '{}',     -- pod -> {cell_type, node_ids, gpu_ids} (training jobs)
    submitted_at  timestamptz,
    updated_at    timestamptz NOT NULL,
    last_reason   text NOT NULL DEFAULT ''
);
CREATE INDEX jobs_state ON jobs (state, job_id);
CREATE INDEX jobs_vc_state ON jobs (vc, state, job_id);
CREATE INDEX jobs_kind_state ON jobs (kind, state, job_id);

-- Every lifecycle change, binding, placement decision, command and refusal of each job, with
-- where it was read from. Ordered by (occurred_at, topic, partition, offset).
CREATE TABLE job_events (
    job_id      text NOT NULL,
    event_id    uuid NOT NULL,
    occurred_at timestamptz NOT NULL,
    topic       text NOT NULL,
    partition   int NOT NULL,
    "offset"    bigint NOT NULL,
    kind        text NOT NULL,                     -- submitted, lifecycle, binding, placement, command, refusal, fault
    what        text NOT NULL,                     -- the state, action or outcome
    reason      text NOT NULL DEFAULT '',
    inputs      jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (job_id, event_id)
);
CREATE INDEX job_events_order ON job_events (job_id, occurred_at, topic, partition, "offset");

CREATE TABLE gpus (
    gpu_id          text PRIMARY KEY,
    node_id         text,
    gpu_type        text,
    health          text,
    health_cause    text,
    health_reason   text NOT NULL DEFAULT '',
    health_metrics  jsonb NOT NULL DEFAULT '{}',
    online_workload text,
    offline_job     text,
    sm_share        double precision,
    offline_since   timestamptz,
    changed_at      timestamptz NOT NULL
);
CREATE INDEX gpus_health ON gpus (health, gpu_id);

CREATE TABLE faults (
    event_id    uuid PRIMARY KEY,
    gpu_id      text NOT NULL,
    node_id     text NOT NULL,
    kind        text NOT NULL,
    detail      text NOT NULL,
    xid         int,
    job_id      text,
    remediation text NOT NULL,
    occurred_at timestamptz NOT NULL
);
CREATE INDEX faults_gpu ON faults (gpu_id, occurred_at);

-- Each VC's guaranteed GPUs (leaf cells) in the newest cell configuration (cells.config).
CREATE TABLE vc_quotas (
    vc              text PRIMARY KEY,
    guaranteed_gpus int NOT NULL,
    config_version  int NOT NULL
);

-- GPUs held by each job's bound pods, by the priority each pod was bound with.
CREATE VIEW job_gpus AS
SELECT job_id, vc, state,
       coalesce(sum(jsonb_array_length(pod -> 'gpu_ids')) FILTER (WHERE pod ->> 'priority' = 'guaranteed'), 0)::int AS guaranteed,
       coalesce(sum(jsonb_array_length(pod -> 'gpu_ids')) FILTER (WHERE pod ->> 'priority' = 'opportunistic'), 0)::int AS opportunistic
FROM jobs LEFT JOIN LATERAL jsonb_each(jobs.binding) AS b(name, pod) ON true
GROUP BY job_id, vc, state;

-- Per VC and job state: how many jobs, and the GPUs their bound pods hold (views over jobs, so
-- they never disagree with them).
CREATE VIEW vcs AS
SELECT vc, state, count(*)::int AS jobs,
       sum(guaranteed)::int AS guaranteed_gpus_used, sum(opportunistic)::int AS opportunistic_gpus_used
FROM job_gpus WHERE vc IS NOT NULL
GROUP BY vc, state;

-- Per VC: guaranteed GPUs, those in use, those free, opportunistic use and the queue length.
CREATE VIEW vc_cells AS
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
       coalesce(u.waiting, 0)::int AS waiting_jobs
FROM vc_quotas AS q FULL JOIN used AS u ON q.vc = u.vc;
