-- Per-tenant accounting (issue 19 item 2; hivemux.projection.usage, hivemux.store.usage).
-- GPU time: one interval per held resource, a bound pod (kind guaranteed or opportunistic, from
-- cells.bindings) or an offline job's shared online GPU (kind shared, resource 'gpu:<id>', from
-- placements). ended_at is the earliest close at or after started_at (NULL: still held).
CREATE TABLE usage_intervals (
    job_id     text NOT NULL,
    resource   text NOT NULL,
    kind       text NOT NULL,
    gpus       int NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at   timestamptz,
    PRIMARY KEY (job_id, resource, started_at)
);
CREATE INDEX usage_intervals_open ON usage_intervals (job_id, kind) WHERE ended_at IS NULL;

-- When a job finished (jobs.lifecycle: completed, failed, rejected, cancelled): it holds nothing
-- it took before then, whichever topic was read first.
CREATE TABLE job_ends (
    job_id   text PRIMARY KEY,
    ended_at timestamptz NOT NULL
);

-- The executors' measurements of sharing (sharing.observations): an offline job's normalized
-- throughput beside an online service and the online slowdown it caused, per window.
CREATE TABLE sharing_observations (
    event_id              uuid PRIMARY KEY,
    job_id                text NOT NULL,
    gpu_id                text NOT NULL,
    online_workload       text,
    window_start          timestamptz NOT NULL,
    window_end            timestamptz NOT NULL,
    normalized_throughput double precision NOT NULL,
    online_slowdown       double precision NOT NULL
);
CREATE INDEX sharing_observations_job ON sharing_observations (job_id, window_end);
