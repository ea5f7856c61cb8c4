"""Whether a config's mesh is far from the best one for its slice, from the shapes alone (no
compile): `t5lite compile` and `t5lite train` print the one line `mesh_advice` returns.

What every fast setting that `t5lite compile --search` found shares (bench/TPU_PLAN.md): the
parameters, their gradients and the optimizer state are sharded over every chip (fsdp), not
copied on each chip of the data axis. A copy per chip costs the HBM it occupies and, each
step, the optimizer update reading and writing all of it: a multi-GB model trained
data-parallel (the default mesh, data=-1) turns HBM-bound (bench/RESULTS.md, issue 34).

Importing this module is light (no jax): the trainer and the CLI call it with byte counts.
"""

from __future__ import annotations

import math

from t5lite.mesh.topology import GiB

# Copies of state above this many bytes per chip (beyond what sharding it would keep) are
# "far": below it (models up to about T5 base) the copies cost little beside the step.
FAR_BYTES = 2 * GiB


def state_bytes(params_per_chip: int, opt_per_chip: int) -> int:
    """Per-chip bytes of parameters + their gradients (same dtype and sharding) + optimizer
    state, as the analytic memory estimate counts them (tpu.memory.analytic_bytes' "state")."""
    return 2 * params_per_chip + opt_per_chip


def leaf_bytes(tree) -> int:
    """Bytes per chip of a tree of ShapeDtypeStructs with shardings."""
    import jax
    n = 0
    for x in jax.tree.leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
        n += math.prod(shape) * x.dtype.itemsize
    return n


def mesh_advice(mesh: dict, params_per_chip: int, opt_per_chip: int,
                hbm_bytes: int = 0) -> str:
    """One line when ``mesh`` ({"data": n, "fsdp": n, "tensor": n}, resolved) copies more than
    FAR_BYTES of training state per chip that fsdp over the data axis too would shard; else "".
    ``params_per_chip`` / ``opt_per_chip``: bytes per chip as the mesh shards them (the
    abstract train state's, or `t5lite compile`'s bytes_per_chip). ``hbm_bytes``: the chip's
    HBM, to say what share the copies take (0: not said)."""
    data = int(mesh.get("data", 1))
    if data <= 1:
        return ""
    now = state_bytes(params_per_chip, opt_per_chip)
    sharded = now / data  # the data axis folded into fsdp: every chip holds 1/chips
    if now - sharded < FAR_BYTES:
        return ""
    fsdp, tensor = int(mesh.get("fsdp", 1)), int(mesh.get("tensor", 1))
    share = f" ({now / hbm_bytes:.0%} of HBM)" if hbm_bytes else ""
    return (f"mesh data={data} fsdp={fsdp} tensor={tensor} copies the parameters, gradients "
            f"and optimizer state on every chip of the data axis: {now / GiB:.2f} GiB per "
            f"chip{share}, read and written by every optimizer update; --set mesh.data=1 "
            f"--set mesh.fsdp=-1 shards them over all {data * fsdp * tensor} chips "
            f"({sharded / GiB:.2f} GiB per chip); which is faster on a slice, `t5lite "
            f"compile --search` says (it ranks both by expected step)")


def train_state_advice(mesh: dict, abstract_state, hbm_bytes: int = 0) -> str:
    """mesh_advice for a train state of ShapeDtypeStructs with shardings (the trainer's
    abstract state: its ``params`` and ``opt_state``)."""
    return mesh_advice(mesh, leaf_bytes(abstract_state.params),
                       leaf_bytes(abstract_state.opt_state), hbm_bytes)
