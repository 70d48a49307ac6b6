"""Test-wide setup: 8 simulated CPU devices, set before jax is imported anywhere."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
