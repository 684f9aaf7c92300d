"""job-controller: decides users' job commands (cancel, suspend, resume) from the job log."""
