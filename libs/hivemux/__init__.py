"""hivemux: a GPU cluster manager for deep learning (HiveD + MuxFlow + Salus).

The library every service imports, in layers; a package imports only from its own layer's
conventions or from layers below it (``tests/unit/test_structure.py`` checks the graph has no
cycle and that the algorithms do no I/O):

1. Conventions and the edges of the bus: ``errors``, ``gpu_ids`` (how a GPU is named),
   ``events`` (the pydantic event models; ``Reason``/``clip_reason``), ``topics`` (the topic
   registry), ``schemas`` (JSON Schemas generated from the models), ``settings``.
2. The pure algorithms, one package per paper mechanism, no I/O, no clock, no environment:
   ``cells`` (HiveD: cells, buddy cell allocation, VCs, preemption), ``health`` (MuxFlow's
   SysMonitor state machine, error patterns, node pressure), ``sharing`` (dynamic SM
   allocation), ``prediction`` (the speed predictor), ``matching`` (matching-based
   scheduling, Kuhn-Munkres), ``lanes`` (Salus's lane assignment and iteration scheduling).
   ``jobs`` (the job controller: users' cancel, suspend and resume commands decided from the log).
   ``projection`` (the read models: each event as the row changes it makes, folded by the projector).
3. The simulated hardware: ``simulated`` (GPU types, workload catalog, interference, fleet,
   simulated node agent), which production may import for the demo and simulated backends.
4. Adapters with I/O: ``bus`` (aiokafka runtime), ``store`` (asyncpg), ``infra`` (embedded
   broker and database), ``telemetry`` (NVML, dcgm-exporter, validation, ingestion),
   ``executor`` (process and simulated node backends, MuxFlow's mixed error handling),
   ``xcuda`` (the shim's files), ``salus`` (the lane gate over gRPC), ``cells_inspect``
   (HiveD's inspect view over gRPC), ``profiling``, ``workloads``, ``observability``.
5. Tools on top: ``experiments`` (the papers' experiments over the simulated hardware),
   ``hived_scenarios`` (HiveD scenario replay), ``status``, ``cli``.

The services (``hivemux.services.<name>``, folder ``services/``) are thin shells over these.
"""

__version__ = "0.1.0"
