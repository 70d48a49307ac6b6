"""Checkpoints: orbax save/restore, integrity manifests, the canonical layout, storage faults."""
