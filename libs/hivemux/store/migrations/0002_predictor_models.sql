-- Speed predictor versions per GPU type (MuxFlow §5.2: one MLP per GPU type), written by the
-- predictor. A version is immutable once written (first write wins, redeliveries change
-- nothing); `published` says whether it went out on `predictor.models` (a retrained model whose
-- held-out error is worse is kept for the record but not published).
CREATE TABLE predictor_models (
    gpu_type      text NOT NULL,
    version       int NOT NULL CHECK (version >= 1),
    kind          text NOT NULL,
    weights_b64   text,
    parameters    jsonb NOT NULL DEFAULT '{}'::jsonb,
    heldout_error double precision,
    trained_on    int NOT NULL DEFAULT 0,
    published     boolean NOT NULL,
    event_id      uuid NOT NULL,
    occurred_at   timestamptz NOT NULL,
    recorded_at   timestamptz DEFAULT now(),
    PRIMARY KEY (gpu_type, version)
);
