"""MuxFlow's workload profiler: each offline job's solo execution features, measured once
(preprint §3 "Workload profiler": "runs the job for a few iterations and measures the execution
information ... stored in a database and can be used by the speed predictor"; §6: dry runs,
DCGM/NVML metrics). The profiler service (`hivemux.services.profiler`) stores and publishes.

Modules, by the paper's parts:
- `profiler`   the rules: reuse the profile of an identical workload (its signature), else
               measure (the calibrated catalog, or a torch dry run with the catalog's GPU
               counters where no GPU was sampled); the `Profile` and PROFILED events;
- `runner`     the dry run (§3, §6): a few timed training steps, iteration time, persistent
               memory (Salus' P_i) and memory peak;
- `workloads`  the torch models of each catalog family that the dry run trains;
- `sampler`    GPU counters during the timed steps through NVML (§6).
"""
