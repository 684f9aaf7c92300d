"""A gang pod's program in the tests (issue 29): joins its torch.distributed job from the
environment the executor gives it (``env://``: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK),
all-reduces ``rank + 1`` over gloo and writes what it saw to ``result.json`` in its
``HIVEMUX_CHECKPOINT_DIR``."""

import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")
seen = {name: os.environ.get(name) for name in names}
Path(os.environ["HIVEMUX_CHECKPOINT_DIR"], "result.json").write_text(json.dumps({**seen, "sum": value.item()}))
dist.destroy_process_group()
