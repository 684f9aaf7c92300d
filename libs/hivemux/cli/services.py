"""The services by their command-line names (the CLI is the one place that knows them all)."""

SERVICES: dict[str, str] = {
    "telemetry-ingester": "hivemux.services.telemetry_ingester.service",
    "health-processor": "hivemux.services.health_processor.service",
    "cell-allocator": "hivemux.services.cell_allocator.service",
    "profiler": "hivemux.services.profiler.service",
    "predictor": "hivemux.services.predictor.service",
    "matcher": "hivemux.services.matcher.service",
    "executor": "hivemux.services.executor.service",
    "job-controller": "hivemux.services.job_controller.service",
    "projector": "hivemux.services.projector.service",
    "api": "hivemux.services.api.service",
}

# The deciding services: each journals its consumption and its module has `rebuild`, so
# `hivemux audit replay` can recompute its decisions.
AUDITED: tuple[str, ...] = ("cell-allocator", "health-processor", "matcher", "predictor")

# Deciders that run with a standby (`bus.leadership`): `hivemux up`, compose and Kubernetes run
# two instances of each; one decides at a time.
SINGLE_ACTIVE: tuple[str, ...] = ("cell-allocator", "matcher")
