"""Many processes: joining the job, agreeing on the configuration, stopping together when a peer fails, and
whether a process still runs on this host (host.py)."""
