-- Solo execution profiles of offline jobs (MuxFlow §5, the profiler), one row per job.
-- A profile is written once (the first `jobs.profiled` event wins, redeliveries change nothing)
-- and reused by later jobs whose workload spec hashes to the same `signature` on the same GPU type.
-- Metrics are nullable: a profiling method may not measure every counter.
CREATE TABLE profiles (
    job_id                text PRIMARY KEY,
    signature             text NOT NULL,
    gpu_type              text NOT NULL,
    method                text NOT NULL,
    iteration_time_ms     double precision,
    gpu_util              double precision,
    sm_activity           double precision,
    sm_occupancy          double precision,
    memory_peak_mib       double precision,
    persistent_memory_mib double precision,
    event_id              uuid NOT NULL,
    occurred_at           timestamptz NOT NULL,
    recorded_at           timestamptz DEFAULT now()
);

-- Serves "the most recent profile for (signature, gpu_type)": the trailing occurred_at lets
-- the lookup read one index entry instead of sorting every match.
CREATE INDEX profiles_signature_gpu_type_idx ON profiles (signature, gpu_type, occurred_at DESC);
