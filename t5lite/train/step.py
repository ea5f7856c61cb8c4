"""The jitted train and eval steps: explicit in/out shardings, the state donated, gradients of
the trainable subset accumulated over micro-batches, non-finite steps skipped."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from t5lite import peft
from t5lite.models import moe
from t5lite.monitor import flops as flops_lib
from t5lite.mesh import partitioning
from t5lite.train import losses, optim
from t5lite.train.state import TrainState, init_rngs


def partition_trainable(tree, mask):
    """-> (the mask's True leaves, its False leaves): two trees like ``tree`` with None in the
    other's places (None is an empty pytree: no gradient, no buffer)."""
    def pick(want):
        return jax.tree.map(lambda t, x: x if bool(t) == want else None, mask, tree)
    return pick(True), pick(False)


def merge_trainable(mask, trainable, frozen):
    """Inverse of partition_trainable: trainable's leaves where mask is True, frozen's
    elsewhere."""
    return jax.tree.map(lambda t, x, y: x if bool(t) else y, mask, trainable, frozen)


def _microbatches(batch, k):
    """[B, ...] -> [k, B/k, ...] with micro-batch j = rows j, j+k, ...: each device's rows stay
    local (the sharded dim is B/k), so the split needs no communication."""
    def split(x):
        x = x.reshape((x.shape[0] // k, k) + x.shape[1:])
        return jax.lax.with_sharding_constraint(jnp.swapaxes(x, 0, 1),
                                                P(None, partitioning.BATCH_AXES))
    return jax.tree.map(split, batch)


def _apply_update(tx, state, grads) -> TrainState:
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    return TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                      opt_state=opt_state)


def _trainable_mask(cfg, param_shardings, trainable):
    """The bools-like-params of what trains: the caller's, else the config's PEFT mask, else
    everything."""
    if trainable is None:
        trainable = peft.grad_mask(cfg.model, param_shardings)
    if trainable is None:
        trainable = jax.tree.map(lambda _: True, param_shardings)
    return trainable


def _accumulated(grad_fn, train, frozen, batch, key, norms, k, train_shardings):
    """(grads, metrics) summed over k micro-batches (lax.scan); micro-batch i drops out with
    fold_in(key, i). The sums equal one big batch's, as the normalisers are the full batch's."""
    if k == 1:
        (_, metrics), grads = grad_fn(train, frozen, batch, jax.random.fold_in(key, 0), norms)
        return grads, metrics
    micro = _microbatches(batch, k)

    def body(acc, xs):
        i, mb = xs
        (_, m), g = grad_fn(train, frozen, mb, jax.random.fold_in(key, i), norms)
        return jax.tree.map(jnp.add, acc, (g, m)), None

    shapes = jax.eval_shape(grad_fn, train, frozen, jax.tree.map(lambda x: x[0], micro), key,
                            norms)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (shapes[1], shapes[0][1]))
    zeros = (jax.lax.with_sharding_constraint(zeros[0], train_shardings), zeros[1])
    (grads, metrics), _ = jax.lax.scan(body, zeros, (jnp.arange(k), micro))
    return grads, metrics


def _update_if_finite(tx, state, grads, ok):
    # lax.cond, not jnp.where(ok, new, old) over the state: a select keeps the old and the
    # new state alive together, so XLA cannot update the donated buffers in place; the cond's
    # taken branch updates in place.
    return jax.lax.cond(ok, functools.partial(_apply_update, tx), lambda s, g: s, state, grads)


def _jit_on_mesh(fn, cfg, mesh, in_shardings, out_shardings, donate_argnums=()):
    """jit(fn) with explicit shardings, called inside the mesh's logical rules."""
    jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings,
                     donate_argnums=donate_argnums,
                     compiler_options=partitioning.compiler_options(cfg, mesh))

    def run(*args):
        with partitioning.activate(mesh):
            return jitted(*args)
    run.jitted = jitted
    return run


def make_train_step(cfg, model, tx, mesh, shardings, schedule=None, trainable=None):
    """jit(state, batch) -> (state, metrics). Gradient accumulation over train.grad_accum_steps
    micro-batches (lax.scan) with the loss normalisers of the full batch, so it equals one big
    batch. Dropout keys: fold_in(seed stream, step, micro). A step whose loss or gradient is not
    finite leaves the state unchanged and reports finite=0; an update that makes the parameters
    overflow (finite gradients, non-finite new param norm) reports params_finite=0.

    Only the trainable params are differentiated (``trainable``: bools like params; default
    ``peft.grad_mask`` of the config): frozen params enter the loss as a non-differentiated
    argument, so gradients, accumulators and the gradient norm cover the trainable subset
    alone (LoRA on a large model holds gradients for the small params only); frozen params
    get zero updates, as the optimizer masks them too."""
    k = cfg.train.grad_accum_steps
    dropout_key = init_rngs(cfg)["dropout"]
    schedule = schedule or optim.make_schedule(cfg.optim, cfg.train.steps)
    trainable = _trainable_mask(cfg, shardings.params, trainable)
    train_shardings, _ = partition_trainable(shardings.params, trainable)

    def micro_loss(train, frozen, micro, key, norms):
        outputs = moe.apply_with_aux_loss(
            model, {"params": merge_trainable(trainable, train, frozen)}, micro,
            deterministic=False, rngs={"dropout": key})
        return losses.compute_loss(cfg, outputs, micro, norms)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def step_fn(state, batch):
        key = jax.random.fold_in(dropout_key, state.step)
        norms = losses.normalizers(cfg, batch)
        train, frozen = partition_trainable(state.params, trainable)
        grads, metrics = _accumulated(grad_fn, train, frozen, batch, key, norms, k,
                                      train_shardings)
        grad_norm = optax.tree.norm(grads)
        ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        # the optimizer sees the whole tree (its state layout is the checkpoint's); frozen
        # leaves get zeros it discards (set_to_zero), which XLA never materialises
        grads = merge_trainable(trainable, grads, jax.tree.map(jnp.zeros_like, frozen))
        new = _update_if_finite(tx, state, grads, ok)
        param_norm = optax.tree.norm(new.params)
        metrics = dict(metrics, grad_norm=grad_norm, param_norm=param_norm,
                       lr=schedule(state.step), finite=ok.astype(jnp.float32),
                       params_finite=jnp.isfinite(param_norm).astype(jnp.float32))
        return new, metrics

    return _jit_on_mesh(step_fn, cfg, mesh,
                        in_shardings=(shardings, partitioning.batch_sharding(mesh)),
                        out_shardings=(shardings, partitioning.replicated(mesh)),
                        donate_argnums=(0,))


def make_eval_step(cfg, model, mesh, param_shardings):
    """jit(params, batch) -> metrics (deterministic forward, same losses as training)."""
    def eval_fn(params, batch):
        outputs = moe.apply_with_aux_loss(model, {"params": params}, batch, deterministic=True)
        return losses.compute_loss(cfg, outputs, batch)[1]

    return _jit_on_mesh(eval_fn, cfg, mesh,
                        in_shardings=(param_shardings, partitioning.batch_sharding(mesh)),
                        out_shardings=partitioning.replicated(mesh))


def step_flops(cfg, model, mesh, abstract_params, batch_size) -> int:
    """Model FLOPs of one training step: 3 x forward matmul FLOPs (forward + backward).

    The model's math, whatever kernel runs it: a model whose model.attention_kernel is not
    "xla" is counted as its "xla" twin (same parameters), since a fused kernel hides its
    matmuls from the jaxpr (cuDNN's is one custom call; a Pallas kernel's body holds one
    block's dots, not the grid's) and its attention would go uncounted."""
    from t5lite.models import dummy_batch
    if cfg.model.attention_kernel != "xla":
        model = peft.build_model(dataclasses.replace(cfg.model, attention_kernel="xla"))
    batch = dummy_batch(cfg.model, batch_size, cfg.data.feature_lengths)
    fwd = functools.partial(model.apply, deterministic=True)
    with partitioning.activate(mesh):
        return 3 * flops_lib.matmul_flops(lambda p, b: fwd({"params": p}, b), abstract_params,
                                          batch)
