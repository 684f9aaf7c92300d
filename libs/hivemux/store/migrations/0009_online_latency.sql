-- Online services' latency and SLO protection in the read models (issue 19; hivemux.projection.online).

-- An online service's submission: what its replicas are measured against (jobs.submitted).
CREATE TABLE online_services (
    job_id       text PRIMARY KEY,
    model        text NOT NULL,
    replicas     int NOT NULL,
    slo_p99_ms   double precision,
    request_rate double precision,
    submitted_at timestamptz NOT NULL
);

-- Each replica's latest latency window (online.latency), one row per (service, GPU). A report
-- replaces the row only if its window ends later (ties: the greater event id), so duplicates,
-- replays and late reports change nothing. window_end is at most the report's event time.
CREATE TABLE online_latency (
    service        text NOT NULL,
    gpu_id         text NOT NULL,
    node_id        text NOT NULL,
    window_start   timestamptz NOT NULL,
    window_end     timestamptz NOT NULL,
    p50_ms         double precision,
    p99_ms         double precision NOT NULL,
    slo_p99_ms     double precision,
    request_rate   double precision,
    offline_job_id text,
    sm_share       double precision,
    launch_target  double precision,
    event_id       uuid NOT NULL,
    PRIMARY KEY (service, gpu_id)
);

-- Every SLO protection step (sharing.protection), once per event id: the latest per GPU and the
-- counts per service and step are queries over it (order-independent).
CREATE TABLE slo_protection_steps (
    event_id       uuid PRIMARY KEY,
    gpu_id         text NOT NULL,
    node_id        text NOT NULL,
    service        text NOT NULL,
    offline_job_id text NOT NULL,
    step           text NOT NULL,
    level          int NOT NULL,
    p99_ms         double precision NOT NULL,
    slo_p99_ms     double precision NOT NULL,
    launch_target  double precision NOT NULL,
    sm_share       double precision,
    reason         text NOT NULL,
    occurred_at    timestamptz NOT NULL
);
CREATE INDEX slo_protection_steps_gpu ON slo_protection_steps (gpu_id, occurred_at DESC, event_id DESC);
CREATE INDEX slo_protection_steps_service ON slo_protection_steps (service, step);

CREATE VIEW slo_protection_latest AS
    SELECT DISTINCT ON (gpu_id) * FROM slo_protection_steps ORDER BY gpu_id, occurred_at DESC, event_id DESC;
