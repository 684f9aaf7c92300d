-- Each GPU's history for `hivemux gpus explain` (hivemux.projection GpuEventRow): health
-- transitions with their metrics and cause, offline placements and evictions on the GPU, faults.
-- Ordered by (occurred_at, topic, partition, offset); a redelivered event is kept once.
CREATE TABLE gpu_events (
    gpu_id      text NOT NULL,
    event_id    uuid NOT NULL,
    occurred_at timestamptz NOT NULL,
    topic       text NOT NULL,
    partition   int NOT NULL,
    "offset"    bigint NOT NULL,
    kind        text NOT NULL,                     -- health, placement, fault
    what        text NOT NULL,                     -- the new state, place/evict, the fault kind
    reason      text NOT NULL DEFAULT '',
    inputs      jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (gpu_id, event_id)
);
CREATE INDEX gpu_events_order ON gpu_events (gpu_id, occurred_at, topic, partition, "offset");
