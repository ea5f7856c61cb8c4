"""Training: TrainState, jit-compiled train / eval steps with explicit shardings, the loop.

The path reads straight: config -> mesh -> abstract state (eval_shape, logical specs ->
shardings) -> restore or init -> data iterator -> loop (host batch -> global array -> step ->
metrics -> checkpoint / eval). Finetuning reuses create_train_state / make_train_step /
make_eval_step.
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Any, Callable, Iterator

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from t5lite.monitor import flops as flops_lib, goodput, progress, writers
from t5lite.store import checkpointing
from t5lite.train import losses, optim, partitioning
from t5lite import config as config_lib
from t5lite.store import workdir as workdir_lib
from t5lite.errors import Preempted, UserError
from t5lite.models import peft


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: number of updates applied
    params: Any  # unboxed float32 params
    opt_state: Any


# ---------------------------------------------------------------------------- state


def _init_batch(cfg, mesh):
    from t5lite.models import dummy_batch
    return dummy_batch(cfg.model, partitioning.data_parallel_size(mesh), cfg.data.feature_lengths)


def _init_rngs(cfg):
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
    batch = _init_batch(cfg, mesh)
    rngs = _init_rngs(cfg)  # outside the mesh: an eager key fails under an abstract TPU mesh
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


def create_train_state(cfg, model, mesh, tx, params=None):
    """Fresh sharded TrainState (params initialised on-device, already sharded) -> (state,
    shardings). `params` (unboxed, e.g. from init_from) replaces the fresh init if given."""
    abstract, shardings, _ = abstract_train_state(cfg, model, mesh, tx)
    batch = _init_batch(cfg, mesh)

    def init(rngs):
        p = nn.meta.unbox(model.init(rngs, batch, deterministic=True)["params"])
        if params is not None:
            p = params
        return TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p))

    with partitioning.activate(mesh):
        state = jax.jit(init, out_shardings=shardings)(_init_rngs(cfg))
    return state, shardings


# ---------------------------------------------------------------------------- steps


def _split_micro(batch, k):
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


def _split(tree, mask):
    """-> (the mask's True leaves, its False leaves): two trees like ``tree`` with None in the
    other's places (None is an empty pytree: no gradient, no buffer)."""
    def pick(want):
        return jax.tree.map(lambda t, x: x if bool(t) == want else None, mask, tree)
    return pick(True), pick(False)


def _join(mask, a, b):
    """Inverse of _split: a's leaves where mask is True, b's elsewhere."""
    return jax.tree.map(lambda t, x, y: x if bool(t) else y, mask, a, b)


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
    dropout_key = _init_rngs(cfg)["dropout"]
    schedule = schedule or optim.make_schedule(cfg.optim, cfg.train.steps)
    if trainable is None:
        trainable = peft.grad_mask(cfg.model, shardings.params)
    if trainable is None:  # everything trains
        trainable = jax.tree.map(lambda _: True, shardings.params)
    train_sh, _ = _split(shardings.params, trainable)

    def micro_loss(train, frozen, micro, key, norms):
        outputs = model.apply({"params": _join(trainable, train, frozen)}, micro,
                              deterministic=False, rngs={"dropout": key})
        return losses.compute_loss(cfg, outputs, micro, norms)

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def step_fn(state, batch):
        key = jax.random.fold_in(dropout_key, state.step)
        norms = losses.normalizers(cfg, batch)
        train, frozen = _split(state.params, trainable)
        if k == 1:
            (_, metrics), grads = grad_fn(train, frozen, batch, jax.random.fold_in(key, 0), norms)
        else:
            micro = _split_micro(batch, k)

            def body(acc, xs):
                i, mb = xs
                (_, m), g = grad_fn(train, frozen, mb, jax.random.fold_in(key, i), norms)
                return jax.tree.map(jnp.add, acc, (g, m)), None

            shapes = jax.eval_shape(grad_fn, train, frozen,
                                    jax.tree.map(lambda x: x[0], micro), key, norms)
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (shapes[1], shapes[0][1]))
            zeros = (jax.lax.with_sharding_constraint(zeros[0], train_sh), zeros[1])
            (grads, metrics), _ = jax.lax.scan(body, zeros, (jnp.arange(k), micro))
        grad_norm = optax.tree.norm(grads)
        ok = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
        # the optimizer sees the whole tree (its state layout is the checkpoint's); frozen
        # leaves get zeros it discards (set_to_zero), which XLA never materialises
        grads = _join(trainable, grads, jax.tree.map(jnp.zeros_like, frozen))
        # lax.cond, not jnp.where(ok, new, old) over the state: a select keeps the old and the
        # new state alive together, so XLA cannot update the donated buffers in place (on CPU
        # that cost ~0.4 s of a 1.5 s T5-small step); the cond's taken branch updates in place.
        new = jax.lax.cond(ok, functools.partial(_apply_update, tx), lambda s, g: s,
                           state, grads)
        param_norm = optax.tree.norm(new.params)
        metrics = dict(metrics, grad_norm=grad_norm, param_norm=param_norm,
                       lr=schedule(state.step), finite=ok.astype(jnp.float32),
                       params_finite=jnp.isfinite(param_norm).astype(jnp.float32))
        return new, metrics

    rep = partitioning.replicated(mesh)
    jitted = jax.jit(step_fn, in_shardings=(shardings, partitioning.batch_sharding(mesh)),
                     out_shardings=(shardings, rep), donate_argnums=(0,),
                     compiler_options=partitioning.compiler_options(cfg, mesh))

    def run(state, batch):
        with partitioning.activate(mesh):
            return jitted(state, batch)
    run.jitted = jitted
    return run


def make_eval_step(cfg, model, mesh, param_shardings):
    """jit(params, batch) -> metrics (deterministic forward, same losses as training)."""
    def eval_fn(params, batch):
        outputs = model.apply({"params": params}, batch, deterministic=True)
        return losses.compute_loss(cfg, outputs, batch)[1]

    jitted = jax.jit(eval_fn, in_shardings=(param_shardings, partitioning.batch_sharding(mesh)),
                     out_shardings=partitioning.replicated(mesh),
                     compiler_options=partitioning.compiler_options(cfg, mesh))

    def run(params, batch):
        with partitioning.activate(mesh):
            return jitted(params, batch)
    return run


def step_flops(cfg, model, mesh, abstract_params, batch_size) -> int:
    """Model FLOPs of one training step: 3 x forward matmul FLOPs (forward + backward)."""
    from t5lite.models import dummy_batch
    batch = dummy_batch(cfg.model, batch_size, cfg.data.feature_lengths)
    fwd = functools.partial(model.apply, deterministic=True)
    with partitioning.activate(mesh):
        return 3 * flops_lib.matmul_flops(lambda p, b: fwd({"params": p}, b), abstract_params,
                                              batch)


# ---------------------------------------------------------------------------- data


def _prepare_tasks(cfg):
    from t5lite import dataprep
    dataprep.use_data_dir(cfg.data.data_dir)
    if cfg.train.prepare_data:
        # every process (hosts may have local disks); a file lock serialises shared ones
        dataprep.ensure_prepared(cfg.train.prepare_data, cfg.data.data_dir)
    from t5lite.tasks import pipeline
    pipeline.import_task_modules(cfg.data.task_modules)
    task = pipeline.get_mixture_or_task(cfg.data.mixture_or_task)
    for name, feat in task.output_features.items():
        size = feat.vocabulary.vocab_size
        if size > cfg.model.vocab_size:
            raise UserError(
                f"model.vocab_size={cfg.model.vocab_size} is smaller than the {size} ids of "
                f"task {cfg.data.mixture_or_task!r} (feature {name!r}). Set model.vocab_size "
                f">= {size} (a multiple of 128 is fastest).")


def train_iterator(cfg, workdir: str):
    """This process's rows of each global training batch, read as data.num_shards seqio
    shards (the workdir's saved shard count wins), so its checkpointed state resumes on
    another process count (tasks/pipeline.py ShardedBatches)."""
    from t5lite.tasks import pipeline
    num_shards = (pipeline.saved_num_shards(os.path.join(workdir, "data_state"))
                  or cfg.data.num_shards or jax.process_count())

    def make_dataset(shard_info, batch_size):
        return pipeline.get_dataset(
            cfg.data.mixture_or_task, feature_lengths=dict(cfg.data.feature_lengths),
            architecture=cfg.model.architecture, batch_size=batch_size,
            split=cfg.data.train_split, shuffle=cfg.data.shuffle, seed=cfg.data.seed,
            pack=cfg.data.pack, shard_info=shard_info, use_cached=cfg.data.use_cached,
            cache_dir=cfg.data.cache_dir)

    return pipeline.ShardedBatches(make_dataset, num_shards, cfg.data.batch_size,
                                   jax.process_index(), jax.process_count())


def dataset_iterator(cfg, split: str, shuffle: bool, num_epochs=None):
    """A tf.data iterator over this process's batches of `split` (evaluation: no state)."""
    from t5lite.tasks import pipeline
    ds = pipeline.get_dataset(
        cfg.data.mixture_or_task, feature_lengths=dict(cfg.data.feature_lengths),
        architecture=cfg.model.architecture,
        batch_size=cfg.data.batch_size // jax.process_count(), split=split, shuffle=shuffle,
        seed=cfg.data.seed, pack=cfg.data.pack, shard_info=partitioning.shard_info(),
        num_epochs=num_epochs, use_cached=cfg.data.use_cached, cache_dir=cfg.data.cache_dir)
    return iter(ds)


def _to_numpy(batch) -> dict:
    return {k: np.asarray(v) for k, v in batch.items()}


# ---------------------------------------------------------------------------- loop


def write_config(cfg, workdir: str) -> None:
    """config.json <- cfg on process 0 (atomic; a different previous one is kept)."""
    if jax.process_index() == 0:  # epath: the workdir may be gs://
        workdir_lib.write_config(cfg, workdir)


def _lock_workdir(workdir: str, lease_seconds: float):
    """WORKDIR/.lock, taken by process 0; every process stops if it could not be taken."""
    lock, error = None, None
    if jax.process_index() == 0:
        try:
            lock = workdir_lib.WorkdirLock(workdir, lease_seconds).acquire()
        except UserError as e:
            error = e
    if not checkpointing.all_hosts_ok(error is None):
        raise error or UserError(f"process 0 could not lock {workdir} (see its message)")
    if lock is not None and lock.took_over:
        print(f"t5lite: {lock.takeover_line()}", flush=True)
    return lock


def train(cfg, workdir: str, train_iter: Iterator | None = None,
          eval_iter_fn: Callable[[], Iterator] | None = None, devices=None,
          trainable_mask=None, allow_config_change: bool = False) -> dict:
    """Train cfg in workdir, resuming from its newest readable checkpoint. -> final metrics.

    train_iter / eval_iter_fn replace the seqio pipeline (any iterators of host batches with
    the contract's keys); tf.data iterators are also checkpointed for exact resume. The workdir
    is locked for the run; a config that differs from its config.json stops the run before
    anything is written (allow_config_change lets the safe keys through, workdir.SAFE_KEYS).
    Raises errors.Preempted after saving a checkpoint on SIGTERM.
    """
    started = time.time()  # goodput: start-up counts from here (goodput.RunClock)
    partitioning.initialize_multihost(cfg.mesh)
    mesh = partitioning.make_mesh(cfg.mesh, devices)
    partitioning.check_batch(mesh, cfg.data.batch_size, cfg.train.grad_accum_steps)
    workdir = checkpointing.abspath(workdir)
    preemption = _Preemption()  # from here on SIGTERM saves instead of killing the run
    lock = None
    try:
        lock = _lock_workdir(workdir, cfg.checkpoint.lock_lease_seconds)
        rewrite = workdir_lib.check_config(cfg, workdir, allow_config_change)
        return _train_locked(cfg, workdir, train_iter, eval_iter_fn, mesh, trainable_mask,
                             rewrite, preemption, started)
    except Exception as e:
        if _no_space(e):
            raise UserError(_no_space_message(workdir)) from None
        raise
    finally:
        preemption.close()
        if lock is not None:
            lock.release()


def _train_locked(cfg, workdir, train_iter, eval_iter_fn, mesh, trainable_mask, rewrite,
                  preemption, started):
    from t5lite.models import build_model
    if train_iter is None:
        _prepare_tasks(cfg)

    model = build_model(cfg.model)
    # PEFT / freezing (cfg.model.peft) or an explicit trainable_mask: frozen params get no
    # optimizer state; gradual unfreezing opens layers inside the jitted update
    tx = peft.make_optimizer(cfg, cfg.train.steps, trainable=trainable_mask)
    abstract, shardings, _ = abstract_train_state(cfg, model, mesh, tx)
    ckpt = checkpointing.Checkpointer(workdir, cfg.checkpoint)
    try:  # from here on the checkpointer is closed on every path (its threads, its tracebacks)
        make_iter = (lambda: train_iter) if train_iter is not None else (
            lambda: train_iterator(cfg, workdir))
        data_iter = make_iter()
        tf_iter = checkpointing.has_data_state(data_iter)
        state, start = ckpt.restore_latest(abstract, data_iter if tf_iter else None)
        if ckpt.data_iter_dirty and train_iter is None:  # a failed data restore, then step 0
            data_iter = make_iter()
        if rewrite:  # only now: the checkpoints it describes have been read with it
            write_config(cfg, workdir)
        logger = writers.MetricsLogger(workdir, cfg.train.steps, start_step=start)
        logger.write_config(config_lib.to_dict(cfg))  # TensorBoard: text + hparams
        try:
            return _loop(cfg, mesh, model, tx, state, start, abstract, shardings, logger, ckpt,
                         data_iter, tf_iter, eval_iter_fn, preemption, started=started,
                         trainable=trainable_mask)
        finally:
            logger.close()
    finally:
        ckpt.close()


class _Preemption:
    """SIGTERM (a spot / queued slice being reclaimed) -> save at the next step boundary.

    One process: a Python SIGTERM handler sets a flag. Several processes: JAX's preemption
    service (on by default with jax.distributed) already catches SIGTERM on any host and
    agrees on one step for all (reached_preemption_sync_point); a Python handler would replace
    its C++ one, so none is installed there.
    """

    def __init__(self):
        import signal
        import threading
        self.signalled = False
        self._old = None
        self.multihost = jax.process_count() > 1
        if not self.multihost and threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame):
        self.signalled = True

    def reached(self, step: int) -> bool:
        if not self.multihost:
            return self.signalled
        from jax.experimental import multihost_utils
        try:
            return multihost_utils.reached_preemption_sync_point(step)
        except RuntimeError:  # jax_enable_preemption_service off: SIGTERM just ends the run
            return False

    def close(self):
        if self._old is not None:
            import signal
            signal.signal(signal.SIGTERM, self._old)
            self._old = None


def _no_space(err: BaseException) -> bool:
    """True when a full disk is somewhere in err's chain (OSError ENOSPC, or orbax / TF
    errors that only carry its message)."""
    import errno
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


def _no_space_message(workdir: str) -> str:
    try:
        import orbax.checkpoint as ocp
        steps = ocp.utils.checkpoint_steps(os.path.join(workdir, "checkpoints"))
        last = max(steps) if steps else None
    except Exception:  # noqa: BLE001 - the message matters more than the step number
        last = "?"
    return (f"no space left on device writing to {workdir}; "
            + (f"the last checkpoint (step {last}) is intact. " if last is not None else
               "no checkpoint was written yet. ")
            + "Free space there and rerun the same command to resume (the half-written save "
            "is cleaned up at start)")


def _loop(cfg, mesh, model, tx, state, start, abstract, shardings, logger, ckpt, data_iter,
          tf_iter, eval_iter_fn, preemption=None, started=None, trainable=None):
    watch = goodput.RunClock(ckpt.workdir, start, enabled=logger.enabled, started=started)
    prof = goodput.Profiler(cfg.train.profile_steps, ckpt.workdir, logger.info)
    if state is not None:
        logger.info(f"resumed from {ckpt.dir}/{start}"
                    + ("" if tf_iter else " (data iterator position not restored: not tf.data)"))
    else:
        state, _ = create_train_state(cfg, model, mesh, tx)
        if cfg.checkpoint.init_from:
            with progress.quiet_absl():  # orbax's read-only notes
                _, src = checkpointing.load_params(cfg.checkpoint.init_from,
                                                   step=cfg.checkpoint.init_step)
            params = checkpointing.merge_params(state.params, src, announce=logger.info)
            state, _ = create_train_state(cfg, model, mesh, tx, params=params)
            logger.info(f"initialised params from {cfg.checkpoint.init_from}")
    logger.info(peft.describe(cfg.model, state.params))
    train_step = make_train_step(cfg, model, tx, mesh, shardings, trainable=trainable)
    eval_step = make_eval_step(cfg, model, mesh, shardings.params)
    from t5lite.eval import evaluation  # task metrics (decoding) + best checkpoint: cfg.eval
    task_eval = (evaluation.TrainEvaluator(cfg, model, ckpt.workdir, mesh, logger)
                 if evaluation.TrainEvaluator.wanted(cfg) else None)
    bsh = partitioning.batch_sharding(mesh)
    flops = step_flops(cfg, model, mesh, abstract.params, cfg.data.batch_size)
    peak = writers.peak_flops_per_device(cfg.train.peak_flops)
    logger.info(f"model FLOPs per step {flops:.3g} (3 x forward matmuls); MFU against "
                + (f"{peak:.3g} FLOP/s per device x {mesh.size}" if peak else
                   f"n/a: no known peak for {jax.devices()[0].device_kind} "
                   "(set train.peak_flops)"))
    total = cfg.train.steps
    last_ckpt = start
    clock = {"t": time.time(), "step": start, "tokens": 0}
    final = {}

    def flush(step, metrics, tokens):
        nonlocal final
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        clock["tokens"] += tokens
        params_finite = m.pop("params_finite")
        if m["finite"] and not params_finite:  # applied: the in-memory state is unusable
            ckpt.wait()
            raise UserError(
                f"step {step} was not finite (the update overflowed the parameters: loss="
                f"{m['loss']:.4g}, grad_norm={m['grad_norm']:.4g}, new param_norm="
                f"{m['param_norm']:.4g}); stopped. The last checkpoint ({last_ckpt or 'none'}) "
                "is good. Lower optim.learning_rate or set optim.clip_grad_norm.")
        if not m.pop("finite"):
            if not cfg.train.stop_on_nan:
                logger.info(f"warning: step {step} not finite (loss={m['loss']:.4g}, "
                            f"grad_norm={m['grad_norm']:.4g}); update skipped")
                return
            ckpt.wait()
            raise UserError(
                f"step {step} was not finite (loss={m['loss']:.4g}, grad_norm="
                f"{m['grad_norm']:.4g}); stopped. The "
                f"state was not updated and the last checkpoint ({last_ckpt or 'none'}) is "
                "good. Lower optim.learning_rate, set optim.clip_grad_norm, or check the data.")
        final = m
        if step % cfg.train.log_every == 0 or step == total:
            now = time.time()
            dt, n = max(now - clock["t"], 1e-9), step - clock["step"]
            m["tokens_per_s"] = clock["tokens"] / dt
            m["steps_per_s"] = n / dt
            if peak:
                m["mfu"] = flops * n / dt / (peak * mesh.size)
            m.update(watch.interval_metrics(step))  # data wait / compute / checkpoint, goodput
            logger.write(step, m)
            watch.save(step)
            clock.update(t=now, step=step, tokens=0)

    pending = None
    watch.loop_started()
    for step in range(start, total):
        if preemption is not None and preemption.reached(step):
            if pending is not None:
                flush(*pending)
            if last_ckpt != step or ckpt.latest_step() is None:  # (a fresh run at step 0)
                ckpt.save(step, state, data_iter if tf_iter else None)
                peft.save_with_checkpoint(cfg, ckpt.workdir, step, state.params)
                watch.checkpoint_saved(step)
            ckpt.wait()  # committed on every host before the exit code says "saved"
            watch.save(step)  # goodput: the time up to the preemption counts
            raise Preempted(step)
        prof.before_step(step)
        t_data = time.time()
        try:
            host = _to_numpy(next(data_iter))
        except StopIteration:
            raise UserError(f"training data ran out at step {step} of {total}; use "
                            "num_epochs=None (repeat) or fewer train.steps") from None
        batch = partitioning.global_batch(host, bsh)
        watch.add("data", time.time() - t_data)
        step_fn = train_step if step > start else watch.compiling(train_step, logger.info)
        with prof.annotate(step):
            state, metrics = step_fn(state, batch)
        prof.after_step(step + 1, metrics)
        if pending is not None:  # read the previous step's metrics while this one runs
            flush(*pending)
        pending = (step + 1, metrics, flops_lib.batch_tokens(host) * jax.process_count())
        if ckpt.should_save(step + 1, total):
            flush(*pending)
            pending = None
            t_ckpt = time.time()
            ckpt.save(step + 1, state, data_iter if tf_iter else None)
            peft.save_with_checkpoint(cfg, ckpt.workdir, step + 1, state.params)
            last_ckpt = step + 1
            watch.add("checkpoint", time.time() - t_ckpt)
            watch.checkpoint_saved(step + 1)
        if cfg.train.eval_every and (step + 1) % cfg.train.eval_every == 0 and step + 1 < total:
            with watch.phase("eval"):
                final.update(_evaluate(cfg, eval_step, state.params, bsh, logger, step + 1,
                                       eval_iter_fn))
        if task_eval is not None and step + 1 < total and task_eval.due(step + 1, total):
            with watch.phase("eval"):
                final.update(task_eval(step + 1, state.params))
    if pending is not None:
        flush(*pending)
    prof.stop(state)
    with watch.phase("eval"):
        if total > start or not final:
            final.update(_evaluate(cfg, eval_step, state.params, bsh, logger, max(total, start),
                                   eval_iter_fn))
        if task_eval is not None and total > start:
            final.update(task_eval(total, state.params))
    if total > start:  # a rerun of a finished run trains nothing and leaves no trace
        watch.save(total)
        logger.info(watch.report(total))
        summary = watch.summary(total)
        logger.write(total, summary, prefix="goodput")
        final["goodput"] = summary["goodput"]
    return final


def _evaluate(cfg, eval_step, params, bsh, logger, step, eval_iter_fn) -> dict:
    """Mean metrics over train.eval_steps batches of data.eval_split (the same batches each
    time: unshuffled, repeated if the split is small)."""
    if cfg.train.eval_steps <= 0:
        return {}
    it = eval_iter_fn() if eval_iter_fn is not None else dataset_iterator(
        cfg, cfg.data.eval_split, shuffle=False)
    sums, n = {}, 0
    for _ in range(cfg.train.eval_steps):
        try:
            host = _to_numpy(next(it))
        except StopIteration:
            break
        m = jax.device_get(eval_step(params, partitioning.global_batch(host, bsh)))
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        n += 1
    if not n:
        return {}
    out = {k: v / n for k, v in sums.items()}
    logger.write(step, out, prefix="eval")
    return {f"eval_{k}": v for k, v in out.items()}
