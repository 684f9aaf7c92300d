-- Jobs' logs (issue 29 item 6; hivemux.projection.logs, written by hivemux.store.logs).

-- One row per chunk shipped on jobs.logs, by its stream (job, node, pod) and byte offset.
-- record_offset: the chunk's offset on jobs.logs (keyed by job: one partition per job), the
-- order chunks were shipped in and a reader's cursor. Each stream keeps its head and its tail
-- (head_bytes, tail_bytes: the bound it was shipped under); what lies between is deleted.
CREATE TABLE job_log_chunks (
    job_id        text NOT NULL,
    node_id       text NOT NULL,
    pod           int NOT NULL,
    "offset"      bigint NOT NULL,
    length        int NOT NULL,
    text          text NOT NULL,
    head_bytes    bigint NOT NULL,
    tail_bytes    bigint NOT NULL,
    record_offset bigint NOT NULL,
    occurred_at   timestamptz NOT NULL,
    PRIMARY KEY (job_id, node_id, pod, "offset")
);
CREATE INDEX job_log_chunks_cursor ON job_log_chunks (job_id, record_offset);

-- The jobs with logs stored and their bytes (small: live jobs and those within their retention);
-- the retention sweep joins it with job_ends (migration 0008).
CREATE TABLE job_logs (
    job_id text PRIMARY KEY,
    bytes  bigint NOT NULL DEFAULT 0
);
