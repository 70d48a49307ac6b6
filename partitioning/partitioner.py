"""The Partitioner owns a mesh and a rule set and hands out shardings.

Models annotate parameters and activations with logical axis names; the Partitioner turns
those names into `NamedSharding`s on its mesh, checks that every sharded dimension divides,
and prints the layout. It knows nothing about any model.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from partitioning.errors import PartitioningError
from partitioning.mesh import MACROS as _MACRO_FOR_AXIS
from partitioning.rules import RuleSet, Rules, get_rule_set


class Partitioner:
    """Mesh + logical-axis rules -> shardings for parameters, optimizer state and batches."""

    def __init__(self, mesh: Mesh, rules: RuleSet | str):
        self.mesh = mesh
        self.rules = get_rule_set(rules) if isinstance(rules, str) else rules
        unused = [axis for axis, size in mesh.shape.items()
                  if size > 1 and axis not in self.rules.mesh_axes_used]
        if unused:
            raise PartitioningError(
                f"mesh axes {unused} have size > 1 but rule set {self.rules.name!r} maps nothing to "
                f"them, so those devices would repeat the same work. Set "
                f"{', '.join(_MACRO_FOR_AXIS[a] + '=1' for a in unused)} or pick a rule set that uses "
                "them (e.g. 'fsdp_tensor')."
            )

    def _rules(self, kind: str) -> Rules:
        if kind not in ("params", "opt_state"):
            raise ValueError(f"sharding kind {kind!r} is unknown; use 'params' or 'opt_state'.")
        return getattr(self.rules, kind) + self.rules.activations

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        """Enter the mesh and the activation rules (for jit, init and model code)."""
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self._rules("params")):
            yield

    def mesh_axes(self, logical_spec: PartitionSpec, kind: str = "params") -> PartitionSpec:
        """Logical names -> mesh axes for one array."""
        return nn.logical_to_mesh_axes(tuple(logical_spec), self._rules(kind))

    def shardings(self, logical_specs: Any, kind: str = "params") -> Any:
        """A tree of logical PartitionSpecs -> a tree of NamedShardings on this mesh."""
        return jax.tree.map(
            lambda spec: NamedSharding(self.mesh, self.mesh_axes(spec, kind)),
            logical_specs, is_leaf=lambda x: isinstance(x, PartitionSpec),
        )

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def partition(self, fn: Callable, in_shardings: Any, out_shardings: Any,
                  donate_argnums: tuple[int, ...] = ()) -> Callable:
        """`fn` jitted with these in/out shardings (and donated arguments) on this mesh."""
        return jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate_argnums)

    def abstract_and_shardings(self, init: Callable[[], Any], offload: tuple[str, ...] = ()) -> tuple[Any, Any]:
        """(abstract boxed tree, NamedShardings) of what `init()` returns, allocating and running nothing
        (the mesh may be compile-only: create any random key inside `init`). Boxed leaves carry logical names; a top-level field listed in
        `offload` (e.g. 'opt_state') is sharded by the optimizer-state rules and kept in host memory,
        and every field whose name is 'opt_state' uses the optimizer-state rules. Each sharded
        dimension is checked to divide."""
        abstract = jax.eval_shape(init)
        specs = nn.get_partition_spec(abstract)
        shardings = {}
        for field in _fields(abstract):
            kind = "opt_state" if field == "opt_state" else "params"
            self.check_divisible(getattr(abstract, field), getattr(specs, field), kind)
            field_shardings = self.shardings(getattr(specs, field), kind)
            if field in offload:
                field_shardings = jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), field_shardings)
            shardings[field] = field_shardings
        return abstract, specs.replace(**shardings)

    def initialize(self, init: Callable[[jax.Array], Any], rng: jax.Array, shardings: Any) -> Any:
        """`init(rng)` (logical boxes removed) created in place with these shardings: no host ever
        holds the whole tree."""
        return jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=shardings)(rng)

    def batch_sharding(self, ndim: int = 2) -> NamedSharding:
        """Rows over the mesh axes of 'activation_batch', everything else replicated."""
        return NamedSharding(self.mesh, self.mesh_axes(PartitionSpec("activation_batch", *[None] * (ndim - 1))))

    def host_batch_layout(self, global_rows: int) -> tuple[int, int]:
        """(index, count) of this process's rows in every global batch, from the mesh: the processes fall
        into `count` groups, those whose devices hold the same rows forming one; a group holds
        global_rows / count rows and loads part `index` of the batch (T5X's data layout). The rows of a
        process whose devices hold several stretches of the batch go to them in order, so the global batch
        is the same set of rows on every layout."""
        held: dict[int, set[tuple[int, int]]] = {}
        for device, index in self.batch_sharding(1).devices_indices_map((global_rows,)).items():
            rows = index[0]
            held.setdefault(device.process_index, set()).add((rows.start or 0, global_rows if rows.stop is None
                                                              else rows.stop))
        groups = sorted({tuple(sorted(stretches)) for stretches in held.values()})
        sizes = {sum(stop - start for start, stop in group) for group in groups}
        if len(sizes) != 1 or sizes.pop() * len(groups) != global_rows:
            raise PartitioningError(f"the batch rows do not split evenly over the processes of mesh {dict(self.mesh.shape)}"
                            f" ({len(groups)} row groups for {global_rows} rows); make BATCH_SIZE a multiple of "
                            f"{self.batch_macros} and give every process the same number of devices.")
        return groups.index(tuple(sorted(held[jax.process_index()]))), len(groups)

    @property
    def batch_shards(self) -> int:
        """How many ways a global batch is split (its row count must be a multiple)."""
        return self.axis_product(self.mesh_axes(PartitionSpec("activation_batch"))[0])

    @property
    def batch_macros(self) -> str:
        """The macros of the mesh axes that split a global batch, as a user sets them: 'DATA_PARALLEL x
        EXPERT_PARALLEL' (those of size 1 left out; DATA_PARALLEL when none splits it)."""
        axes = self.mesh_axes(PartitionSpec("activation_batch"))[0] or ()
        axes = (axes,) if isinstance(axes, str) else axes
        return " x ".join(_MACRO_FOR_AXIS[a] for a in axes if self.mesh.shape[a] > 1) or _MACRO_FOR_AXIS["data"]

    def axis_product(self, axes: str | tuple[str, ...] | None) -> int:
        if axes is None:
            return 1
        axes = (axes,) if isinstance(axes, str) else axes
        return math.prod(self.mesh.shape[a] for a in axes)

    def check_divisible(self, abstract: Any, logical_specs: Any, kind: str = "params") -> None:
        """Raise naming the array, dimension and fix when a sharded dimension does not divide."""
        for (path, array), spec in zip(_leaves_with_paths(abstract), _spec_leaves(logical_specs)):
            mesh_spec = self.mesh_axes(spec, kind)
            for dim, (size, logical, axes) in enumerate(zip(array.shape, spec, mesh_spec)):
                ways = self.axis_product(axes)
                if size % ways:
                    macros = " x ".join(_MACRO_FOR_AXIS[a] for a in ((axes,) if isinstance(axes, str) else axes))
                    raise PartitioningError(
                        f"{path}: dimension {dim} ({logical!r}, size {size}) does not divide over mesh "
                        f"axes {axes} ({ways} devices). Choose {macros} dividing {size}, change the "
                        f"model size, or use a rule set that does not shard {logical!r}."
                    )

    def describe(self, abstract: Any, logical_specs: Any, kind: str = "params") -> str:
        """A table: parameter -> shape -> logical axes -> mesh axes."""
        rows = [("parameter", "shape", "logical axes", "mesh axes")]
        for (path, array), spec in zip(_leaves_with_paths(abstract), _spec_leaves(logical_specs)):
            rows.append((path, str(tuple(array.shape)), str(tuple(spec)), str(tuple(self.mesh_axes(spec, kind)))))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        header = f"mesh {dict(self.mesh.shape)}, rules {self.rules.name!r}"
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        return "\n".join([header] + lines)


def _fields(tree: Any) -> list[str]:
    """The dataclass fields of a flax struct (e.g. a train state)."""
    return [f.name for f in tree.__dataclass_fields__.values()]


def _leaves_with_paths(tree: Any) -> list[tuple[str, Any]]:
    is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # noqa: E731
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_box)[0]
    return [("/".join(_key_name(k) for k in path), leaf.unbox(apply_constraint=False) if is_box(leaf) else leaf)
            for path, leaf in leaves]


def _spec_leaves(specs: Any) -> list[PartitionSpec]:
    return jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def _key_name(key) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)
