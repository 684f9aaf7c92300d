-- The HTTP API's bearer tokens (hivemux.store.tokens, issue 17): only the SHA-256 of each
-- token's secret is kept. A tenant token acts on the jobs of its VCs; an admin token on all,
-- and may drain GPUs and publish cell configurations. Revoked tokens stay, for the record.
CREATE TABLE api_tokens (
    token_id      text PRIMARY KEY,
    secret_sha256 bytea NOT NULL UNIQUE,
    tenant        text NOT NULL,
    vcs           text[] NOT NULL DEFAULT '{}',
    admin         boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz
);

-- The API's change stream (hivemux.api.changes) finds what the projector wrote since its last
-- tick by log position: the rows read from a partition between two stored offsets.
CREATE INDEX job_events_position ON job_events (topic, partition, "offset");
CREATE INDEX gpu_events_position ON gpu_events (topic, partition, "offset");
-- A tenant lists its VCs' jobs by id.
CREATE INDEX jobs_vc_id ON jobs (vc, job_id);
