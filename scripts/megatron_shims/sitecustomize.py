"""Lets Megatron-LM's own tools/preprocess_data.py start on a CPU machine with Python 3.11 and no Triton.

1. Triton kernels. `megatron.core` and `megatron.training` import, at start-up, modules of GPU kernels whose
   first lines are an unconditional `import triton` (MoE paged stash, Mamba-2 SSD, causal conv1d); Triton
   is not installed here (a real or fake `triton` package would also switch torch's own Triton paths on).
   Preprocessing never calls those kernels. Each megatron module whose source has a top-level
   `import triton` / `from triton ...` line is replaced by an empty module whose names all resolve to a
   function that raises if it is ever called. Nothing else of Megatron is replaced.
2. Megatron-LM's HEAD requires Python >= 3.12 and imports `typing.override` (new in 3.12), a decorator that
   only marks a method; this venv is Python 3.11, so it gets the same marker.
"""
import importlib.abc
import importlib.machinery
import re
import sys
import typing

_TRITON_LINE = re.compile(rb"^(import triton|from triton[ .])", re.MULTILINE)
STUBBED: list[str] = []  # module names replaced in this process


class _KernelModuleStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if not name.startswith("megatron."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        with open(spec.origin, "rb") as f:
            if not _TRITON_LINE.search(f.read()):
                return None
        return importlib.machinery.ModuleSpec(name, self, origin=spec.origin)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        STUBBED.append(name)

        def __getattr__(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)

            def unavailable(*args, **kwargs):
                raise RuntimeError(f"{name}.{attr} is a Triton kernel; Triton is not installed here")
            return unavailable

        module.__getattr__ = __getattr__


sys.meta_path.insert(0, _KernelModuleStub())

if not hasattr(typing, "override"):
    def _override(method):
        try:
            method.__override__ = True
        except (AttributeError, TypeError):
            pass
        return method

    typing.override = _override
