"""Device mesh, the one table of logical-axis rules, shardings of state and batches.

Parallelism is data: a mesh with axes (data, fsdp, tensor) from cfg.mesh and LOGICAL_RULES
mapping the model's logical axis names (CONTRACTS.md) to mesh axes. fsdp shards parameters and
optimizer state along `embed`; tensor shards heads / mlp / vocab; the batch is split over
(data, fsdp). Changing the parallelism is a config edit, never a model edit.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from t5lite.errors import UserError
from t5lite.mesh import topology, xla_flags

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Rules are tried in order; a mesh axis already used by an earlier dimension of the same array
# is skipped (flax semantics), so an activation [batch, length, embed] keeps `embed` unsharded
# because `batch` already took fsdp.
LOGICAL_RULES: tuple[tuple[str, Any], ...] = (
    # mixture-of-experts weights [expert, embed, mlp] and dispatched tokens [expert, batch,
    # capacity, embed]: experts over the data axis (expert parallelism, GShard); first, so
    # `expert` takes `data` before `batch` of the same array could
    ("expert", "data"),
    ("batch", BATCH_AXES),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("kv", None),
    ("length", None),
    ("layers", None),
    ("relpos_buckets", None),
    ("token_types", None),
    ("abspos", None),
    ("classes", None),
    ("encoder_layers", None),  # transparent attention's per-layer encoder outputs
    ("memory", None),  # product key memory slots (values [memory, embed]: embed over fsdp)
    ("memory_keys", None),
)


def initialize_multihost(mesh_cfg) -> None:
    """jax.distributed.initialize() for multi-process runs (TPU pods, SLURM, several GPUs hosts).

    Unset fields come from $T5LITE_COORDINATOR / $T5LITE_NUM_PROCESSES / $T5LITE_PROCESS_ID
    (launch/multinode.sh, launch/local_multiprocess.py), else JAX discovers the cluster (TPU
    metadata, SLURM env vars).
    """
    if not mesh_cfg.multihost:
        return
    env = os.environ
    kwargs = {}
    if mesh_cfg.coordinator_address or env.get("T5LITE_COORDINATOR"):
        kwargs["coordinator_address"] = (mesh_cfg.coordinator_address
                                         or env["T5LITE_COORDINATOR"])
    try:
        if mesh_cfg.num_processes > 0 or env.get("T5LITE_NUM_PROCESSES"):
            kwargs["num_processes"] = (mesh_cfg.num_processes
                                       or int(env["T5LITE_NUM_PROCESSES"]))
        if mesh_cfg.process_id >= 0 or env.get("T5LITE_PROCESS_ID"):
            kwargs["process_id"] = (mesh_cfg.process_id if mesh_cfg.process_id >= 0
                                    else int(env["T5LITE_PROCESS_ID"]))
    except ValueError as e:
        raise UserError(f"$T5LITE_NUM_PROCESSES / $T5LITE_PROCESS_ID must be integers ({e})")
    if not jax.distributed.is_initialized():
        jax.distributed.initialize(**kwargs)


def mesh_shape(mesh_cfg, num_devices: int) -> tuple[int, int, int]:
    """Resolve the one -1 entry to 'the remaining devices'; check the product."""
    dims = {a: getattr(mesh_cfg, a) for a in MESH_AXES}
    free = [a for a, d in dims.items() if d == -1]
    if len(free) > 1:
        raise UserError(f"at most one of mesh.data/fsdp/tensor may be -1, got {dims}")
    for a, d in dims.items():
        if d == 0 or d < -1:
            raise UserError(f"mesh.{a}={d}: use a positive size, or -1 for the remaining devices")
    fixed = math.prod(d for d in dims.values() if d != -1)
    if free:
        if num_devices % fixed:
            # name the axes to reset, e.g. a preset's tensor=4 (chosen for its TPU slice) run
            # on one GPU
            reset = " ".join(f"--set mesh.{a}=1" for a, d in dims.items() if d > 1)
            raise UserError(
                f"mesh {dims} does not divide the {num_devices} devices: the fixed axes use "
                f"{fixed}. Choose sizes whose product divides {num_devices} (e.g. {reset}).")
        dims[free[0]] = num_devices // fixed
    elif fixed != num_devices:
        raise UserError(
            f"mesh {dims} uses {fixed} devices but {num_devices} are available. Make "
            f"data*fsdp*tensor = {num_devices}, or set one axis to -1 (e.g. --set mesh.data=-1).")
    return tuple(dims[a] for a in MESH_AXES)


def make_mesh(mesh_cfg, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
    """A (data, fsdp, tensor) mesh with Auto axis types (GSPMD propagation for linen code).

    Devices are laid out along the slice's physical torus where the axis sizes are products
    of its physical dims (jax.make_mesh); where one is not (tensor=2 on v5p-256's 4x4x8), a
    physical dim is split between mesh axes (MaxText's allow_split_physical_axes) rather than
    refusing a mesh of the right size."""
    devices = list(devices) if devices is not None else jax.devices()
    shape = mesh_shape(mesh_cfg, len(devices))
    types = (jax.sharding.AxisType.Auto,) * 3
    try:
        return jax.make_mesh(shape, MESH_AXES, axis_types=types, devices=devices)
    except NotImplementedError:  # "Failed to find assignment ... allow_split_physical_axes"
        from jax.experimental import mesh_utils
        grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
        return jax.sharding.Mesh(grid, MESH_AXES, axis_types=types)


@contextlib.contextmanager
def activate(mesh, rules=LOGICAL_RULES):
    """Make `mesh` and the rules current (for tracing linen code with logical constraints)."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        yield


def logical_sharding(logical_specs, mesh, rules=LOGICAL_RULES):
    """Tree of logical PartitionSpecs -> tree of NamedShardings on `mesh`."""
    return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


# Collective matmuls (XLA's windowed einsums: an fsdp all-gather or reduce-scatter matmul split
# into a loop of one matmul per shard pair) are on only when mesh.collective_matmul asks for
# them (config.MeshConfig): off, the step runs faster (bench/RESULTS.md).
_ALL_GATHER_MATMULS = "xla_tpu_enable_windowed_einsum_for_all_gather"
_REDUCE_SCATTER_MATMULS = "xla_tpu_enable_windowed_einsum_for_reduce_scatter"


def compiler_options(cfg, mesh) -> dict:
    """XLA options for programs jitted over ``mesh`` from ``cfg``: on TPU, the chip
    generation's asynchronous-collective options (xla_flags.ASYNC_COLLECTIVES, the table the
    TPU launcher's LIBTPU_INIT_ARGS also come from) and collective matmuls only when
    mesh.collective_matmul asks for them; nothing elsewhere, nor without a mesh (None: one
    default device, as evaluation runs from a checkpoint). No model keeps them on: the pinned
    libtpu compiles T5 v1.0 with dropout under remat with both off, and crashed compiling
    T5 v1.0 large with the all-gather ones on (bench/RESULTS.md)."""
    device = None if mesh is None else mesh.devices.flat[0]
    if device is None or device.platform != "tpu":
        return {}
    chip = topology.chip_of(device.device_kind)
    return tpu_compiler_options(chip.name if chip else "", cfg.mesh.collective_matmul)


def tpu_compiler_options(chip_name: str, collective_matmul: bool) -> dict:
    """compiler_options for a TPU of generation ``chip_name`` (the chip table's name), with
    no devices at hand (bench/tpu_plan.py checks a stored report's options against it)."""
    options = xla_flags.async_collective_options(chip_name)
    if not collective_matmul:
        options.update({_ALL_GATHER_MATMULS: False, _REDUCE_SCATTER_MATMULS: False})
    return options


def batch_sharding(mesh) -> NamedSharding:
    """Leading (batch) dimension over (data, fsdp); other dims replicated."""
    return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def data_parallel_size(mesh) -> int:
    return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch(mesh, global_batch: int, grad_accum_steps: int = 1) -> None:
    """Every micro-batch must split evenly over the batch axes and processes."""
    n = data_parallel_size(mesh)
    micro = global_batch // grad_accum_steps
    if micro % n:
        raise UserError(
            f"micro-batch {micro} (data.batch_size={global_batch} / train.grad_accum_steps="
            f"{grad_accum_steps}) is not divisible by mesh data*fsdp={n}. Change "
            f"data.batch_size to a multiple of {n * grad_accum_steps}, or change the mesh.")
    if global_batch % jax.process_count():
        raise UserError(f"data.batch_size={global_batch} must be divisible by the "
                        f"{jax.process_count()} processes")


def check_divisible(abstract_params, logical_specs, mesh, rules=LOGICAL_RULES,
                    sizes=None) -> None:
    """Each sharded parameter dimension must divide by its mesh axes' size. ``sizes``
    {logical name: size} checks that size instead of the dim's (a flat kernel's joined
    heads x head_dim dim is named "heads": the heads must divide, as the activations split
    them)."""
    mesh_specs = nn.logical_to_mesh(logical_specs, rules)
    flat_a = jax.tree_util.tree_leaves_with_path(abstract_params)
    flat_m = jax.tree.leaves(mesh_specs, is_leaf=lambda x: isinstance(x, P))
    flat_l = jax.tree.leaves(logical_specs, is_leaf=lambda x: isinstance(x, P))
    for (path, leaf), mspec, lspec in zip(flat_a, flat_m, flat_l):
        for dim, (size, axes) in enumerate(zip(leaf.shape, tuple(mspec))):
            if axes is None:
                continue
            axes = (axes,) if isinstance(axes, str) else tuple(axes)
            n = math.prod(mesh.shape[a] for a in axes)
            name = lspec[dim]
            size = (sizes or {}).get(name, size)
            if size % n:
                hint = {"heads": "model.num_heads", "mlp": "model.d_ff",
                        "vocab": "model.vocab_size", "embed": "model.d_model",
                        "expert": "model.num_experts"}.get(name, name)
                raise UserError(
                    f"parameter {jax.tree_util.keystr(path)} dimension '{name}' of size {size} "
                    f"is sharded over mesh axes {axes} of size {n}, which does not divide it. "
                    f"Make {hint} a multiple of {n}, or shrink mesh.{'/'.join(axes)}.")


def opt_state_specs(abstract_opt_state, abstract_params, param_specs):
    """PartitionSpecs for optimizer state: a leaf that mirrors a parameter (same path suffix and
    shape, e.g. Adam's mu/nu) takes that parameter's spec; anything else (step counts, Adafactor's
    factored row/column statistics, which are O(rows + cols)) is replicated."""
    by_path = {}
    for (path, leaf), spec in zip(
            jax.tree_util.tree_leaves_with_path(abstract_params),
            jax.tree.leaves(param_specs, is_leaf=lambda x: isinstance(x, P))):
        by_path[tuple(path)] = (leaf.shape, spec)
    depths = sorted({len(p) for p in by_path}, reverse=True)

    def spec_for(path, leaf):
        path = tuple(path)
        for d in depths:
            hit = by_path.get(path[-d:]) if len(path) >= d else None
            if hit is not None and hit[0] == getattr(leaf, "shape", None):
                return hit[1]
        return P()

    return jax.tree_util.tree_map_with_path(spec_for, abstract_opt_state)


def global_batch(host_batch: dict, sharding: NamedSharding) -> dict:
    """This process's slice of the batch (numpy) -> global jax.Arrays sharded over the batch
    axes."""
    out = {}
    for k, v in host_batch.items():
        v = np.asarray(v)
        shape = (v.shape[0] * jax.process_count(),) + v.shape[1:]
        out[k] = jax.make_array_from_process_local_data(sharding, v, shape)
    return out


def shard_info():
    """seqio ShardInfo for this process (each process reads a disjoint slice of the data)."""
    import seqio
    return seqio.ShardInfo(index=jax.process_index(), num_shards=jax.process_count())


def bytes_per_device(tree) -> int:
    """Bytes of `tree` held on the first addressable device (shard sizes, not global sizes)."""
    dev = jax.local_devices()[0]
    total = 0
    for x in jax.tree.leaves(tree):
        for s in x.addressable_shards:
            if s.device == dev:
                total += s.data.nbytes
    return total
