"""Prometheus counters of the bus runtime (exposed by each service's /metrics)."""

from prometheus_client import Counter, Gauge

CONSUMED = Counter("hivemux_records_consumed_total", "Records consumed", ["service", "topic"])
PUBLISHED = Counter("hivemux_events_published_total", "Events published by handlers and tickers", ["service"])
DUPLICATES = Counter("hivemux_duplicate_events_total", "Re-delivered events skipped by event_id", ["service", "topic"])
CLASHES = Counter("hivemux_event_id_clashes_total", "Records whose event id was handled with another body elsewhere (both handled)", ["service", "topic"])
DEAD_LETTERS = Counter("hivemux_dead_letters_total", "Records sent to a dead-letter topic", ["service", "topic", "stage"])
HANDLER_ERRORS = Counter("hivemux_handler_errors_total", "Handlers or tickers that raised", ["service", "topic"])
DEAD_LETTER_FAILURES = Counter("hivemux_dead_letter_failures_total", "Records that could not even be dead-lettered", ["service", "topic"])
OUTAGES = Counter("hivemux_outages_total", "Broker or database outages the service waited out", ["service"])
UNPROVEN = Counter("hivemux_unproven_records_total", "Records refused at admission: unsigned, or a signature that does not hold", ["service", "topic"])
UNDECIDED_HELD = Gauge("hivemux_undecided_records_held", "Records a standby holds until a leader decides them (bus.undecided)", ["service"])
UNDECIDED_DECIDED = Counter("hivemux_undecided_records_decided_total", "Held records decided on taking the lead (no leader had decided them)", ["service"])
UNDECIDED_OVERFLOW = Counter("hivemux_undecided_records_overflow_total", "Held records folded undecided: more held than the bound", ["service"])
