"""Many processes: joining the job, agreeing on the configuration, stopping together when a peer fails."""
