-- Where an online service's replicas serve (issue 29; hivemux.projection.online): a replica
-- running the service's own command reports its endpoint (node address:PORT) when it passes its
-- readiness probe (executor.reports, step "ready"). One row per (service, GPU); the latest ready
-- report wins (ties: the greater event id), so duplicates and replays change nothing.
-- (Numbered after 0014_job_logs of issue 29's log shipping; renumber on merge if needed.)
CREATE TABLE online_endpoints (
    service  text NOT NULL,
    gpu_id   text NOT NULL,
    node_id  text NOT NULL,
    endpoint text NOT NULL,
    ready_at timestamptz NOT NULL,
    event_id uuid NOT NULL,
    PRIMARY KEY (service, gpu_id)
);
