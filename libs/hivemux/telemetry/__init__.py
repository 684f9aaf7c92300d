"""MuxFlow's GPU monitor on the way in: GPU and node readings from the devices, validated and
batched into telemetry events (preprint §3 "GPU monitor": it "periodically collects GPU
metrics, such as GPU utilization, memory usage, and SM clock"; §6: DCGM and NVML). Not in the
paper: a reading that fails validation is dead-lettered with its reason, not published. The
ingester service (`hivemux.services.telemetry_ingester`) samples on a timer and publishes.

Modules:
- `readings`    what every backend returns (`GpuReading`, `NodeReading`);
- `backend`     the backend interfaces; `backends` builds a real node's (NVML or dcgm-exporter
                for the GPUs, procfs for the node); the simulated fleet's lives in
                `hivemux.simulated.telemetry_source`;
- `nvml`, `dcgm`, `procfs`  the device backends;
- `validation`  which readings are published (limits, staleness, names) and their columnar
                batches;
- `ingest`      one sampling instant: readings in, per-partition batches, node samples and
                dead letters out, a chunk of nodes at a time;
- `offline`     which offline job runs on which GPU, folded from the executors (and the load a
                simulated GPU feels).
"""
