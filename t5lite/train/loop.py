"""The training loop: for each step, stop if preempted, feed a batch, run the step, read the
previous step's metrics (the device runs one step ahead), save and evaluate when due; then the
final evaluation and the run's goodput.

`TrainRun` holds what train() built (model, optimizer, shardings, logger, checkpointer, data);
`_Loop` holds what changes per step (the state, the metrics waiting to be read, the last
checkpoint); `Throughput` turns the tokens and steps since the last log into rates.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterator

import jax

from t5lite.errors import Preempted, UserError
from t5lite import peft, progress
from t5lite.models import gpu_attention
from t5lite.monitor import flops as flops_lib, goodput, profiler, writers
from t5lite.store import checkpointing
from t5lite.store import workdir as workdir_lib
from t5lite.mesh import advice
from t5lite.mesh import partitioning
from t5lite.train import data
from t5lite.train.state import create_train_state, init_params
from t5lite.train.step import make_eval_step, make_train_step, step_flops


@dataclasses.dataclass
class TrainRun:
    """The pieces of one training run, built once by train() and read by the loop."""
    cfg: Any
    mesh: Any
    model: Any
    tx: Any  # the optax optimizer
    abstract: Any  # abstract TrainState (shapes and shardings)
    shardings: Any  # TrainState of NamedShardings
    logger: writers.MetricsLogger
    ckpt: checkpointing.Checkpointer
    data_iter: Iterator
    tf_iter: bool  # the data iterator's position is saved with each checkpoint
    eval_iter_fn: Callable[[], Iterator] | None = None
    preemption: Any = None  # guards.Preemption
    started: float | None = None  # goodput: start-up counts from here
    trainable: Any = None  # bools like params, or None: the config's PEFT mask
    on_start: Callable[[], None] | None = None  # called once set up, before the first step

    @property
    def saved_data_iter(self):
        return self.data_iter if self.tf_iter else None


class Throughput:
    """Tokens and steps since the last logged step -> tokens/s, steps/s and MFU."""

    def __init__(self, step: int, flops: int, peak: float | None, devices: int):
        self.flops, self.peak, self.devices = flops, peak, devices
        self.t, self.step, self.tokens = time.time(), step, 0

    def add_tokens(self, n: int) -> None:
        self.tokens += n

    def rates(self, step: int) -> dict:
        """The rates since the last call (or the start); the next interval starts now."""
        now = time.time()
        dt, n = max(now - self.t, 1e-9), step - self.step
        out = {"tokens_per_s": self.tokens / dt, "steps_per_s": n / dt}
        if self.peak:
            out["mfu"] = self.flops * n / dt / (self.peak * self.devices)
        self.t, self.step, self.tokens = now, step, 0
        return out


def run_loop(run: TrainRun, state, start: int) -> dict:
    """Train from `start` (state: the restored TrainState, or None for a fresh one) to
    train.steps. -> the final metrics. Raises errors.Preempted after saving on a preemption."""
    return _Loop(run, state, start).run()


def _initial_state(run: TrainRun, state, start: int):
    """-> (state, first step): the restored state as is; else a fresh one, its params merged
    with init_from's (and with checkpoint.init_state, its step and optimizer state too)."""
    cfg, logger, ckpt = run.cfg, run.logger, run.ckpt
    if state is not None:
        unrestored = " (data iterator position not restored: not tf.data)"
        logger.info(f"resumed from {ckpt.dir}/{start}" + ("" if run.tf_iter else unrestored))
        return state, start
    if not cfg.checkpoint.init_from:
        return create_train_state(cfg, run.model, run.mesh, run.tx,
                                  shardings=run.shardings)[0], start
    fresh = init_params(cfg, run.model, run.mesh, run.shardings.params)
    with progress.quiet_absl():  # orbax's read-only notes
        _, src = checkpointing.load_params(cfg.checkpoint.init_from, step=cfg.checkpoint.init_step)
    params = checkpointing.merge_params(fresh, src, announce=logger.info)
    state, _ = create_train_state(cfg, run.model, run.mesh, run.tx, params=params,
                                  shardings=run.shardings)
    logger.info(f"initialised params from {cfg.checkpoint.init_from}")
    if cfg.checkpoint.init_state:
        return _continued_state(run, state)
    return state, start


def _continued_state(run: TrainRun, state):
    """T5's finetuning: continue the pretraining run's step count and, where its layout is
    this run's, its optimizer state (Adafactor's second-moment decay depends on the step)."""
    cfg, logger = run.cfg, run.logger
    abstract = {"step": run.abstract.step, "opt_state": run.abstract.opt_state}
    with progress.quiet_absl():
        step, saved = checkpointing.load_opt_state(cfg.checkpoint.init_from, abstract,
                                                   step=cfg.checkpoint.init_step)
    if step >= cfg.train.steps:
        raise UserError(f"train.steps ({cfg.train.steps}) must exceed the step of "
                        f"{cfg.checkpoint.init_from} ({step}): with checkpoint.init_state it "
                        "counts the pretraining steps too (pretraining + finetuning steps).")
    if saved is None:
        logger.info(f"continuing at step {step}; optimizer state starts fresh (its layout "
                    "differs from the pretraining run's)")
        return state.replace(step=jax.device_put(jax.numpy.int32(step), run.shardings.step)), step
    logger.info(f"continuing at step {step} with the optimizer state of "
                f"{cfg.checkpoint.init_from}")
    return state.replace(step=saved["step"], opt_state=saved["opt_state"]), step


def _task_evaluator(run: TrainRun):
    """evaluation.TrainEvaluator (task metrics by decoding, the best checkpoint) when cfg.eval
    asks for one, else None."""
    from t5lite.eval import evaluation
    if not evaluation.TrainEvaluator.wanted(run.cfg):
        return None
    return evaluation.TrainEvaluator(run.cfg, run.model, run.ckpt.workdir, run.mesh, run.logger)


def _throughput(run: TrainRun, start: int) -> Throughput:
    """Counts the step's model FLOPs, says what MFU is measured against, starts the clock."""
    cfg, mesh = run.cfg, run.mesh
    flops = step_flops(cfg, run.model, mesh, run.abstract.params, cfg.data.batch_size)
    peak = writers.peak_flops_per_device(cfg.train.peak_flops)
    run.logger.info(f"model FLOPs per step {flops:.3g} (3 x forward matmuls); MFU against "
                    + (f"{peak:.3g} FLOP/s per device x {mesh.size}" if peak else
                       f"n/a: no known peak for {jax.devices()[0].device_kind} "
                       "(set train.peak_flops)"))
    if warning := writers.warmup_warning(cfg.optim, cfg.train.steps, start):
        run.logger.info(warning)
    if line := advice.train_state_advice(dict(mesh.shape), run.abstract):
        run.logger.info(line)
    return Throughput(start, flops, peak, mesh.size)


class _Loop:
    """One run of the loop: what changes from step to step, and a method per concern."""

    def __init__(self, run: TrainRun, state, start: int):
        cfg, logger = run.cfg, run.logger
        self.state, start = _initial_state(run, state, start)
        self.run_parts, self.start, self.total = run, start, cfg.train.steps
        self.watch = goodput.RunClock(run.ckpt.workdir, start, enabled=logger.enabled,
                                      started=run.started)
        self.profiler = profiler.Profiler(cfg.train.profile_steps, run.ckpt.workdir, logger.info)
        logger.info(peft.describe(cfg.model, self.state.params))
        if line := gpu_attention.describe(cfg.model):  # what "auto" runs here, said once
            logger.info(line)
        self.train_step = make_train_step(cfg, run.model, run.tx, run.mesh, run.shardings,
                                          trainable=run.trainable)
        self.eval_step = make_eval_step(cfg, run.model, run.mesh, run.shardings.params)
        self.task_eval = _task_evaluator(run)
        self.batch_sharding = partitioning.batch_sharding(run.mesh)
        self.throughput = _throughput(run, start)
        self.last_ckpt = start
        self.final = {}
        self.pending = None  # (step, metrics on device, tokens): read after the next step starts

    def run(self) -> dict:
        if self.run_parts.on_start is not None:
            self.run_parts.on_start()
        self.watch.loop_started()
        for step in range(self.start, self.total):
            self._stop_if_preempted(step)
            self._step(step)
            if self.run_parts.ckpt.should_save(step + 1, self.total):
                self._save(step + 1)
            self._evaluate_if_due(step + 1)
        self._read_pending()
        self.profiler.stop(self.state)
        self._final_evaluation()
        if self.total > self.start:  # a rerun of a finished run trains nothing, leaves no trace
            self._report_goodput()
        return self.final

    def _step(self, step: int) -> None:
        """Feed one batch and run one train step; read the previous step's metrics meanwhile."""
        run = self.run_parts
        self.profiler.before_step(step)
        t_data = time.time()
        host, batch = data.next_train_batch(run.data_iter, self.batch_sharding, step, self.total)
        self.watch.add("data", time.time() - t_data)
        step_fn = (self.train_step if step > self.start
                   else self.watch.compiling(self.train_step, run.logger.info))
        with self.profiler.annotate(step):
            self.state, metrics = step_fn(self.state, batch)
        self.profiler.after_step(step + 1, metrics)
        self._read_pending()
        self.pending = (step + 1, metrics, flops_lib.batch_tokens(host) * jax.process_count())

    def _read_pending(self) -> None:
        """Fetch the pending step's metrics, stop or warn if it was not finite, log when due."""
        if self.pending is None:
            return
        step, metrics, tokens = self.pending
        self.pending = None
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        self.throughput.add_tokens(tokens)
        if not self._check_finite(step, m):
            return
        self.final = m
        cfg = self.run_parts.cfg
        if step % cfg.train.log_every == 0 or step == self.total:
            m.update(self.throughput.rates(step))
            m.update(self.watch.interval_metrics(step))  # data wait / compute / checkpoint
            self.run_parts.logger.write(step, m)
            self.watch.save(step)

    def _check_finite(self, step: int, m: dict) -> bool:
        """Pops the finite flags from m. -> False for a skipped update (train.stop_on_nan off);
        raises UserError for an overflowed update or a skipped one that should stop the run."""
        run = self.run_parts
        last = self.last_ckpt or "none"
        params_finite = m.pop("params_finite")
        if m["finite"] and not params_finite:  # applied: the in-memory state is unusable
            run.ckpt.wait()
            raise UserError(
                f"step {step} was not finite (the update overflowed the parameters: loss="
                f"{m['loss']:.4g}, grad_norm={m['grad_norm']:.4g}, new param_norm="
                f"{m['param_norm']:.4g}); stopped. The last checkpoint ({last}) "
                f"is good. {workdir_lib.recovery_hint(run.cfg, self.last_ckpt)}")
        if m.pop("finite"):
            return True
        if not run.cfg.train.stop_on_nan:
            run.logger.info(f"warning: step {step} not finite (loss={m['loss']:.4g}, "
                            f"grad_norm={m['grad_norm']:.4g}); update skipped")
            return False
        run.ckpt.wait()
        raise UserError(
            f"step {step} was not finite (loss={m['loss']:.4g}, grad_norm="
            f"{m['grad_norm']:.4g}); stopped. The "
            f"state was not updated and the last checkpoint ({last}) is "
            f"good. {workdir_lib.recovery_hint(run.cfg, self.last_ckpt)}")

    def _write_checkpoint(self, step: int) -> None:
        run = self.run_parts
        run.ckpt.save(step, self.state, run.saved_data_iter)
        peft.save_with_checkpoint(run.cfg, run.ckpt.workdir, step, self.state.params)

    def _save(self, step: int) -> None:
        self._read_pending()
        t_ckpt = time.time()
        self._write_checkpoint(step)
        self.last_ckpt = step
        self.watch.add("checkpoint", time.time() - t_ckpt)
        self.watch.checkpoint_saved(step)

    def _stop_if_preempted(self, step: int) -> None:
        """On a preemption: save this step (unless just saved), wait for the save to commit on
        every host, then raise Preempted so the exit code says "saved"."""
        run = self.run_parts
        if run.preemption is None or not run.preemption.reached(step):
            return
        self._read_pending()
        if self.last_ckpt != step or run.ckpt.latest_step() is None:  # (a fresh run at step 0)
            self._write_checkpoint(step)
            self.watch.checkpoint_saved(step)
        run.ckpt.wait()  # committed on every host before the exit code says "saved"
        self.watch.save(step)  # goodput: the time up to the preemption counts
        raise Preempted(step)

    def _evaluate_if_due(self, step: int) -> None:
        """Eval-split losses every train.eval_every steps and task metrics when the task
        evaluator says so; neither at the last step (the final evaluation covers it)."""
        run, cfg = self.run_parts, self.run_parts.cfg
        if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < self.total:
            with self.watch.phase("eval"):
                self.final.update(evaluate(cfg, self.eval_step, self.state.params,
                                           self.batch_sharding, run.logger, step,
                                           run.eval_iter_fn))
        if self.task_eval is not None and step < self.total and self.task_eval.due(step,
                                                                                   self.total):
            with self.watch.phase("eval"):
                self.final.update(self.task_eval(step, self.state.params))

    def _final_evaluation(self) -> None:
        run, trained = self.run_parts, self.total > self.start
        with self.watch.phase("eval"):
            if trained or not self.final:
                self.final.update(evaluate(run.cfg, self.eval_step, self.state.params,
                                           self.batch_sharding, run.logger,
                                           max(self.total, self.start), run.eval_iter_fn))
            if self.task_eval is not None and trained:
                self.final.update(self.task_eval(self.total, self.state.params))

    def _report_goodput(self) -> None:
        logger = self.run_parts.logger
        self.watch.save(self.total)
        logger.info(self.watch.report(self.total))
        summary = self.watch.summary(self.total)
        logger.write(self.total, summary, prefix="goodput")
        self.final["goodput"] = summary["goodput"]


def evaluate(cfg, eval_step, params, batch_sharding, logger, step, eval_iter_fn) -> dict:
    """Mean metrics over train.eval_steps batches of data.eval_split (the same batches each
    time: unshuffled, repeated if the split is small)."""
    if cfg.train.eval_steps <= 0:
        return {}
    it = eval_iter_fn() if eval_iter_fn is not None else data.dataset_iterator(
        cfg, cfg.data.eval_split, shuffle=False)
    sums, n = {}, 0
    for _ in range(cfg.train.eval_steps):
        try:
            host = data.to_numpy(next(it))
        except StopIteration:
            break
        m = jax.device_get(eval_step(params, partitioning.global_batch(host, batch_sharding)))
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + float(v)
        n += 1
    if not n:
        return {}
    out = {k: v / n for k, v in sums.items()}
    logger.write(step, out, prefix="eval")
    return {f"eval_{k}": v for k, v in out.items()}
