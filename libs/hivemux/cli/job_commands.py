"""The `jobs` group with every command on it: submission and control (`jobs`), the read-side
views (`job_views`) and logs (`job_logs`) register themselves on `jobs_group` when imported."""

from . import job_logs, job_views  # noqa: F401 - they register their commands on jobs_group
from .jobs import jobs_group

__all__ = ["jobs_group"]
