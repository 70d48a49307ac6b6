"""The error partitioning raises for a mesh, rule set or layout that cannot work (the message names the setting
and the fix); the CLIs print it as one line, as they print t5x_like's own UserError."""


class PartitioningError(ValueError):
    """A mesh, rule or sharding setting that cannot work here; the message says which and how to fix it."""
