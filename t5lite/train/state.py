"""The train state: its abstract shape with shardings (for restore and AOT) and a fresh one.

Parameter specs come from the model's logical axis names; the optimizer state mirrors them, so
a TrainState's shardings are data the step's jit and the checkpointer both read.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from t5lite.mesh import partitioning


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: number of updates applied
    params: Any  # unboxed float32 params
    opt_state: Any


def init_batch(cfg, mesh):
    """A dummy batch of the config's shapes, one row per data-parallel shard (init, tracing)."""
    from t5lite.models import dummy_batch
    return dummy_batch(cfg.model, partitioning.data_parallel_size(mesh), cfg.data.feature_lengths)


def init_rngs(cfg) -> dict:
    """The run's two key streams: params (init) and dropout (folded with the step)."""
    key = jax.random.key(cfg.train.seed)
    return {"params": jax.random.fold_in(key, 0), "dropout": jax.random.fold_in(key, 1)}


def _heads(mcfg) -> int:
    """A head count every attention of the model's divides into whole (the gcd: a mesh size
    divides it iff it divides each): the model's, and ELECTRA's generator's when it has one.
    A flat kernel joins heads x head_dim into its "heads" dim, so the check needs this."""
    if not mcfg.electra.generator_d_model:
        return mcfg.num_heads
    from t5lite.models import electra
    return math.gcd(mcfg.num_heads, electra.generator_config(mcfg).num_heads)


def abstract_train_state(cfg, model, mesh, tx):
    """-> (abstract TrainState with shardings, TrainState of NamedShardings, param logical specs).

    Parameter specs come from the model's logical axis names (jax.eval_shape of model.init, then
    nn.get_partition_spec); optimizer state mirrors them (partitioning.opt_state_specs).
    """
    batch = init_batch(cfg, mesh)
    rngs = init_rngs(cfg)  # outside the mesh: an eager key fails under an abstract TPU mesh
    with partitioning.activate(mesh):
        boxed = jax.eval_shape(functools.partial(model.init, deterministic=True),
                               rngs, batch)["params"]
    logical = jax.tree.map(lambda s: s if s is not None else P(), nn.get_partition_spec(boxed),
                           is_leaf=lambda x: x is None or isinstance(x, P))
    params = nn.meta.unbox(boxed)
    partitioning.check_divisible(params, logical, mesh, sizes={"heads": _heads(cfg.model)})
    param_sh = partitioning.logical_sharding(logical, mesh)
    opt = jax.eval_shape(tx.init, params)
    opt_logical = partitioning.opt_state_specs(opt, params, logical)
    opt_sh = partitioning.logical_sharding(opt_logical, mesh)
    shardings = TrainState(step=partitioning.replicated(mesh), params=param_sh, opt_state=opt_sh)
    abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=params, opt_state=opt)
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            abstract, shardings)
    return abstract, shardings, logical


def init_params(cfg, model, mesh, param_shardings):
    """Freshly initialised params, made on-device already sharded (unboxed)."""
    batch = init_batch(cfg, mesh)

    def init(rngs):
        return nn.meta.unbox(model.init(rngs, batch, deterministic=True)["params"])

    with partitioning.activate(mesh):
        return jax.jit(init, out_shardings=param_shardings,
                       compiler_options=partitioning.compiler_options(cfg, mesh))(init_rngs(cfg))


def create_train_state(cfg, model, mesh, tx, params=None, shardings=None):
    """Fresh sharded TrainState (params initialised on-device, already sharded) -> (state,
    shardings). `params` (unboxed, e.g. from init_from) replaces the fresh init if given;
    `shardings` (abstract_train_state's) saves building the abstract state again."""
    if shardings is None:
        _, shardings, _ = abstract_train_state(cfg, model, mesh, tx)
    batch = init_batch(cfg, mesh)

    def init(rngs):
        p = params if params is not None else nn.meta.unbox(
            model.init(rngs, batch, deterministic=True)["params"])
        return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p))

    with partitioning.activate(mesh):
        state = jax.jit(init, out_shardings=shardings,
                        compiler_options=partitioning.compiler_options(cfg, mesh))(init_rngs(cfg))
    return state, shardings
