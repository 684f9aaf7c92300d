"""GPU and node telemetry: the readings every backend returns, the backends, validation."""
