"""Training's public entry: train(cfg, workdir) wires the pieces.

The path reads straight: config -> mesh -> abstract state (state.py: eval_shape, logical specs
-> shardings) -> restore or init -> data iterator (data.py) -> loop (loop.py: host batch ->
global array -> step (step.py) -> metrics -> checkpoint / eval), inside the guards (guards.py:
workdir lock, preemption, disk full). Finetuning, AOT compiles and the benchmarks reuse the
names re-exported here (create_train_state / make_train_step / make_eval_step / step_flops).
"""

from __future__ import annotations

from typing import Callable, Iterator

import jax

from t5lite import config as config_lib
from t5lite.errors import UserError
from t5lite import peft
from t5lite.monitor import goodput, profiler, writers
from t5lite.store import checkpointing, set_aside, startup
from t5lite.store import workdir as workdir_lib
from t5lite.mesh import partitioning
from t5lite.train import guards, optim
from t5lite.train.data import (dataset_iterator, parse_skip, prepare_tasks, skip_batches,
                               train_iterator)
from t5lite.train.loop import TrainRun, run_loop
from t5lite.train.state import TrainState, abstract_train_state, create_train_state
from t5lite.train.step import make_eval_step, make_train_step, step_flops

__all__ = ["TrainState", "abstract_train_state", "create_train_state", "dataset_iterator",
           "make_eval_step", "make_train_step", "prepare_tasks", "step_flops", "train",
           "train_iterator", "write_config"]


def write_config(cfg, workdir: str, step: int | None = None) -> None:
    """config.json <- cfg on process 0 (atomic; a different previous one is kept, the change
    recorded in config_history.jsonl from `step`)."""
    if jax.process_index() == 0:  # epath: the workdir may be gs://
        workdir_lib.write_config(cfg, workdir, step)


def train(cfg, workdir: str, train_iter: Iterator | None = None,
          eval_iter_fn: Callable[[], Iterator] | None = None, devices=None,
          trainable_mask=None, allow_config_change: bool = False,
          resume_from: int | None = None) -> dict:
    """Train cfg in workdir, resuming from its newest readable checkpoint. -> final metrics.

    train_iter / eval_iter_fn replace the seqio pipeline (any iterators of host batches with
    the contract's keys); tf.data iterators are also checkpointed for exact resume. The workdir
    is locked for the run; a config that differs from its config.json stops the run before
    anything is written (allow_config_change lets the safe keys through, workdir.SAFE_KEYS),
    and a run that fails while nothing was ever trained there takes back what it wrote
    (store/startup.py). resume_from S: the checkpoints after step S are set aside first
    (store/set_aside.py), once the config guard has passed, so the run resumes from S.
    Raises errors.Preempted after saving a checkpoint on SIGTERM.
    """
    started = goodput.run_started()  # goodput: start-up counts from here (goodput.RunClock)
    profiler.parse_steps(cfg.train.profile_steps)  # mistakes found now cost no write
    partitioning.initialize_multihost(cfg.mesh)
    mesh = partitioning.make_mesh(cfg.mesh, devices)
    partitioning.check_batch(mesh, cfg.data.batch_size, cfg.train.grad_accum_steps)
    parse_skip(cfg.train.skip_batches)  # a malformed one stops here, before any write
    writers.check_wandb(cfg.train)
    workdir = checkpointing.abspath(workdir)
    checkpointing.check_init_from(cfg.checkpoint, workdir)
    if train_iter is None:  # the tasks, their data and eval.best_metric: before any write
        cfg = prepare_tasks(cfg)
    writes = startup.StartupWrites(workdir)
    preemption = guards.Preemption()  # from here on SIGTERM saves instead of killing the run
    lock = None
    try:
        lock = guards.lock_workdir(workdir, cfg.checkpoint.lock_lease_seconds)
        writes.begin()
        rewrite = workdir_lib.check_config(cfg, workdir, allow_config_change)
        if resume_from is not None:
            _set_aside_after(workdir, resume_from)
        return _train_locked(cfg, workdir, train_iter, eval_iter_fn, mesh, trainable_mask,
                             rewrite, preemption, started)
    except BaseException as e:
        writes.undo()  # nothing trained: the workdir as it was (the writers are closed)
        if isinstance(e, Exception) and guards.no_space(e):
            raise UserError(guards.no_space_message(workdir)) from None
        raise
    finally:
        preemption.close()
        if lock is not None:
            lock.release()
            writes.remove_if_new()


def _set_aside_after(workdir: str, step: int) -> None:
    """Every process checks the step (a bad one moves nothing); process 0 moves, and the
    others list the checkpoints only after it has."""
    set_aside.check_step(workdir, step)
    if jax.process_index() == 0:
        print(f"t5lite: {set_aside.set_aside_after(workdir, step)}", flush=True)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices("t5lite_resume_from")


def _train_locked(cfg, workdir, train_iter, eval_iter_fn, mesh, trainable_mask, rewrite,
                  preemption, started):
    model = peft.build_model(cfg.model)
    # PEFT / freezing (cfg.model.peft) or an explicit trainable_mask: frozen params get no
    # optimizer state; gradual unfreezing opens layers inside the jitted update
    tx = optim.optimizer_for(cfg, cfg.train.steps, trainable=trainable_mask)
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
        logger = writers.MetricsLogger(workdir, cfg.train.steps, start_step=start)
        logger.write_config(config_lib.to_dict(cfg))  # TensorBoard: text + hparams
        skip_batches(cfg, data_iter, start, logger.info)
        try:
            run = TrainRun(cfg=cfg, mesh=mesh, model=model, tx=tx, abstract=abstract,
                           shardings=shardings, logger=logger, ckpt=ckpt, data_iter=data_iter,
                           tf_iter=tf_iter, eval_iter_fn=eval_iter_fn, preemption=preemption,
                           started=started, trainable=trainable_mask,
                           # config.json once the run is set up: the checkpoints it
                           # describes have been read with it, and a mistake found while
                           # setting up leaves the old one (and its history) as it was
                           on_start=(lambda: write_config(cfg, workdir, start)) if rewrite
                           else None)
            return run_loop(run, state, start)
        finally:
            logger.close()
    finally:
        ckpt.close()
