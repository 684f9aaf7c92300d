"""MuxFlow's workload profiler: each offline job's solo execution features, measured once
(preprint §3 "Workload profiler": "runs the job for a few iterations and measures the execution
information ... stored in a database and can be used by the speed predictor"; §6: dry runs,
DCGM/NVML metrics). The profiler service (`hivemux.services.profiler`) stores and publishes.

Modules, by the paper's parts:
- `profiler`   the rules: reuse the profile of an identical workload (its signature), else
               measure (the job's own command; without one, the calibrated catalog, or a torch
               dry run with the catalog's GPU counters where no GPU was sampled); the
               `Profile` and PROFILED events;
- `command_run` the dry run of a job's own command (issue 29): launched as the executor would,
               bounded by iterations and time, killed (process group) at the end;
- `progress_rate` its solo speed, read from the progress protocol its program writes;
- `runner`     the dry run (§3, §6): a few timed training steps, iteration time, persistent
               memory (Salus' P_i) and memory peak;
- `workloads`  the torch models of each catalog family that the dry run trains;
- `sampler`    GPU counters during the timed steps through NVML (§6).
"""
