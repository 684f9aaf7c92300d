"""telemetry-ingester: samples GPUs and nodes and publishes telemetry (MuxFlow §3, GPU monitor).

Backends: the simulated fleet, NVML, or a dcgm-exporter endpoint (`hivemux.telemetry`). The
offline jobs on each GPU are folded from the executor commands and reports
(`hivemux.telemetry.offline`): samples name them, and the simulated GPUs feel their load.
"""
