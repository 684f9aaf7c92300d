"""health-processor: the per-GPU SysMonitor state machine over telemetry (MuxFlow §4.2).

This first version classifies each sample against Unhealthy/Overlimit thresholds
(`hivemux.health.thresholds`) and publishes a transition whenever a GPU's state changes, and
a fault when a GPU's XID counter grows. The full SysMonitor (dwell times, Disabled, recovery)
and the error-pattern detector come with the health issue.
"""
