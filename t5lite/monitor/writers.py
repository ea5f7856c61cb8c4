"""Training metrics: console progress bar (tqdm), TensorBoard events (tensorboardX),
workdir/metrics.jsonl and, when train.wandb_project asks, a Weights & Biases run; model FLOPs
utilisation (MFU).

Only process 0 writes. On resume, records after the restored step are dropped from the JSONL
and TensorBoard is told to purge them, so the logs always describe one consistent run.
"""

from __future__ import annotations

import json
import math
import os
import sys

import jax
import numpy as np
from etils import epath

from t5lite.errors import UserError
from t5lite.mesh import topology


def peak_flops_per_device(override: float = 0.0):
    """Peak FLOP/s of one local device (mesh.topology's chip table), or None when unknown (CPUs:
    no honest single number; pass train.peak_flops to get an MFU against a peak you choose).
    MFU = achieved model FLOP/s / peak."""
    if override > 0:
        return override
    return topology.peak_flops(jax.local_devices()[0].device_kind)


def warmup_warning(opt_cfg, steps: int, start: int = 0) -> str:
    """A line when the linear warmup (constant / cosine / linear schedules) outlasts the run,
    so the learning rate never reaches optim.learning_rate; '' otherwise. rsqrt's "warmup" is
    its constant phase (T5), which may outlast a short run by design."""
    warmup = int(opt_cfg.warmup_steps)
    if opt_cfg.schedule == "rsqrt" or warmup <= 0 or warmup < steps or steps <= start:
        return ""
    reached = opt_cfg.learning_rate * min(1.0, steps / warmup)
    return (f"warning: optim.warmup_steps={warmup} >= train.steps={steps}: the learning rate "
            f"ramps up for the whole run and ends at {reached:.3g}, never reaching "
            f"optim.learning_rate={opt_cfg.learning_rate:g}; lower optim.warmup_steps (e.g. "
            f"{max(steps // 10, 1)})")


def _summary_writer_cls():
    """tensorboardX.SummaryWriter without its optional `import torch` (seconds of start-up,
    only used to accept torch tensors); a torch already imported is left alone."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # makes `import torch` raise ImportError inside tensorboardX
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


def _append(path: str, text: str) -> None:
    """Append to a local file or a gs:// object (gcsfs would open "a" as "w" and drop every
    earlier line: store/gcs.py appends by composing)."""
    from t5lite.store import gcs
    if gcs.is_gcs(path):
        gcs.append(path, text.encode())
        return
    with epath.Path(path).open("a") as f:
        f.write(text)


class MetricsLogger:
    """One call per logged step; writes bar / TensorBoard / JSONL on process 0 only."""

    def __init__(self, workdir: str, total_steps: int, start_step: int = 0, enabled=None,
                 progress_bar: bool = True):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.bar = self.tb = self.wandb = None
        self._kept_last = set()  # the records at start_step the workdir already holds
        if not self.enabled:
            return
        epath.Path(workdir).mkdir(parents=True, exist_ok=True)  # epath: workdir may be gs://
        self._truncate_after(start_step)
        self.tb = _summary_writer_cls()(os.path.join(workdir, "tensorboard"),
                                        purge_step=start_step + 1)
        if progress_bar:
            from t5lite import progress  # plain lines instead of a bar in a log file
            self.bar = progress.bar(total=total_steps, initial=start_step, unit="step",
                                    desc="train", dynamic_ncols=True, smoothing=0.1)
        self.step = start_step

    def _truncate_after(self, step: int) -> None:
        """Drop records after `step` (the restored checkpoint) and repair a torn line (power
        loss, full disk): unparseable lines move to metrics.jsonl.damaged, never vanish. The
        rewrite is atomic, so a crash here cannot lose the file."""
        from t5lite.store.paths import write_atomic
        path = epath.Path(self.path)
        if not path.exists():
            return
        text = path.read_bytes().decode("utf-8", errors="replace")
        kept, damaged = [], []
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                row_step = row.get("step", 0) if isinstance(row, dict) else None
            except ValueError:
                row_step = None
            if row_step is None:
                damaged.append(line + "\n")
            elif row_step <= step:
                kept.append(line + "\n")
                if row_step == step:
                    self._kept_last.add(line)
        if damaged:
            _append(self.path + ".damaged", "".join(damaged))
            print(f"t5lite: warning: {self.path}: {len(damaged)} unreadable line(s) (a torn "
                  f"write?) moved to {self.path}.damaged", flush=True)
        if "".join(kept) != text:
            write_atomic(path, "".join(kept))

    def write(self, step: int, metrics: dict, prefix: str = "train") -> None:
        if not self.enabled:
            return
        scalars = {k: float(np.asarray(v)) for k, v in metrics.items()}
        line = json.dumps({"step": step, "split": prefix, **scalars})
        # a rerun of a finished run re-evaluates the same params: its record, identical to
        # the one kept, is written to no history twice (TensorBoard kept it too: purge_step)
        if line not in self._kept_last:
            _append(self.path, line + "\n")
            for k, v in scalars.items():
                if math.isfinite(v):
                    self.tb.add_scalar(f"{prefix}/{k}", v, step)
            if self.wandb is not None:
                self.wandb.write(step, scalars, prefix)
        if self.bar is not None:
            if prefix == "train":
                show = {"loss": "{:.4f}", "accuracy": "{:.3f}", "lr": "{:.2e}",
                        "tokens_per_s": "{:.0f}", "mfu": "{:.1%}"}
                post = {k.replace("tokens_per_s", "tok/s"): f.format(scalars[k])
                        for k, f in show.items() if k in scalars}
                # the postfix first: update() is what prints a line, and it must show this
                # step's metrics beside this step's count. No "mfu n/a" here: the loop says
                # once at the start when no device peak is known.
                self.bar.set_postfix(post, refresh=False)
                self.bar.update(step - self.step)
                self.step = step
            elif prefix != "goodput":  # the trainer prints goodput as a sentence
                self.bar.write(f"step {step} {prefix}: " + ", ".join(
                    f"{k}={v:.4g}" for k, v in scalars.items()))

    def write_config(self, config: dict) -> None:
        """The resolved config in TensorBoard: as text (Text tab) and as hparams (HParams tab,
        against the train / eval loss), so runs can be told apart and compared. A config with
        train.wandb_project also starts (or resumes) the workdir's W&B run, with the config."""
        if self.tb is None:
            return
        if config.get("train", {}).get("wandb_project") and self.wandb is None:
            self.wandb = WandbWriter(os.path.dirname(self.path), config)
        from tensorboardX.summary import hparams
        self.tb.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)
        flat = {}

        def walk(d, prefix=""):
            for k, v in d.items():
                if isinstance(v, dict) and k != "feature_lengths":
                    walk(v, f"{prefix}{k}.")
                else:
                    flat[prefix + k] = v if isinstance(v, (bool, int, float, str)) else str(v)
        walk(config)
        for summary in hparams(flat, {"train/loss": None, "eval/loss": None}):
            self.tb._get_file_writer().add_summary(summary)
        self.tb.flush()

    def info(self, msg: str) -> None:
        if self.enabled:
            (self.bar.write if self.bar is not None else print)(msg)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.close()
            self.wandb = None
        if self.bar is not None:
            self.bar.close()


def check_wandb(train_cfg) -> None:
    """Before a run writes anything: train.wandb_project needs wandb installed (found, not
    imported: importing it costs seconds)."""
    import importlib.util
    if train_cfg.wandb_project and importlib.util.find_spec("wandb") is None:
        raise UserError(_NO_WANDB)


_NO_WANDB = ("train.wandb_project is set but wandb is not installed: pip install wandb (or "
             "unset train.wandb_project)")


class WandbWriter:
    """The same records in a Weights & Biases run (``import wandb`` only here: an optional
    dependency). One W&B run per workdir: its id is kept in WORKDIR/wandb_run.json, so a resumed
    run continues it. W&B cannot drop the records after a restored checkpoint as metrics.jsonl
    and TensorBoard do, so every record carries its training step as the x-axis ("step")
    instead of W&B's own counter: a resumed run's curves continue from the restored step."""

    def __init__(self, workdir: str, config: dict):
        try:
            import wandb
        except ImportError:
            raise UserError(_NO_WANDB) from None
        train = config.get("train", {})
        try:
            self.run = wandb.init(
                project=train["wandb_project"], entity=train.get("wandb_entity") or None,
                mode=train.get("wandb_mode") or None, id=_wandb_run_id(workdir),
                resume="allow", name=os.path.basename(workdir.rstrip("/")), config=config,
                dir=None if "://" in workdir else workdir,  # W&B's own files: local only
                settings=wandb.Settings(console="off", quiet=True))
        except wandb.errors.Error as e:  # not logged in, no network, a bad entity
            first = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")
            raise UserError(f"Weights & Biases: {first}; run `wandb login`, or set "
                            "train.wandb_mode=offline (sync later with `wandb sync`)") from None
        self.run.define_metric("step", hidden=True)
        self.run.define_metric("*", step_metric="step")

    def write(self, step: int, scalars: dict, prefix: str) -> None:
        self.run.log({"step": step, **{f"{prefix}/{k}": v for k, v in scalars.items()
                                       if math.isfinite(v)}})

    def close(self) -> None:
        self.run.finish()


def _wandb_run_id(workdir: str) -> str:
    """The workdir's W&B run id (WORKDIR/wandb_run.json), made on first use."""
    path = epath.Path(workdir) / "wandb_run.json"
    try:
        return json.loads(path.read_text())["id"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    import uuid
    from t5lite.store.paths import write_atomic
    run_id = uuid.uuid4().hex[:12]
    write_atomic(path, json.dumps({"id": run_id}))
    return run_id
