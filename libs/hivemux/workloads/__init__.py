"""Real workload programs the process executor launches (`python -m hivemux.workloads.<name>`).

- `train`: a CPU PyTorch training loop (offline jobs and training pods) that checkpoints to its
  checkpoint directory every N iterations and on SIGTERM, resumes from the checkpoint, and
  appends progress as JSON lines to its progress file;
- `online`: an online-service stand-in that answers requests with a small model and appends its
  request latency per window to its progress file.

Both read where to write from the environment the executor sets (`HIVEMUX_CHECKPOINT_DIR`,
`HIVEMUX_PROGRESS_FILE`); see `hivemux.workloads.progress` for the line format.
"""
