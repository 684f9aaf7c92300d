"""Audit replay (`hivemux audit replay`): every deciding service rebuilt from its consumption
journal and the log, every decision recomputed and compared with the record (`replay`), over
records read from the broker or from memory (`log`)."""

from .log import ArchiveLog, BrokerLog, LoggedRecord, MemoryLog
from .replay import AuditReport, Auditor, Divergence, apply_overrides

__all__ = ["ArchiveLog", "AuditReport", "Auditor", "BrokerLog", "Divergence", "LoggedRecord", "MemoryLog", "apply_overrides"]
