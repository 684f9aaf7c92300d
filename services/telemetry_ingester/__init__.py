"""telemetry-ingester: samples GPUs and nodes and publishes telemetry (MuxFlow §3, GPU monitor).

This first version samples the simulated fleet; NVML and dcgm-exporter backends come with
the telemetry issue. Offline load on each GPU is folded from the executor commands and
reports, so the simulated GPUs feel the offline jobs the matcher placed on them.
"""
