"""Where a training run's time goes (data wait, compute, checkpointing), and goodput across
restarts.

Goodput = seconds spent in productive train steps / wall seconds of every process of the run.
Badput: start-up (from the `t5lite` command's start, or from `trainer.train` for a later run of
the process or a call from Python, to the first step: imports, init, restore), compiling the
train step, waiting for data, checkpointing, evaluation, and steps lost to a restart (steps
trained after the checkpoint a resumed run restarts from, computed again). The accounting is
kept in WORKDIR/goodput.json (rewritten atomically at every log step and checkpoint), so a
resumed run reports the whole run's goodput. Time between processes (a job waiting in a queue)
is reported as `downtime_s` but not counted in the wall time.
"""

from __future__ import annotations

import contextlib
import json
import time

import jax
from etils import epath

from t5lite.store import paths

PHASES = ("startup", "compile", "step", "data", "checkpoint", "eval", "lost")
GOODPUT_FILE = "goodput.json"
_process_counted = []  # the first run of a `t5lite` command counts the process's start-up


def run_started() -> float:
    """When this run's start-up began: for the first run of a `t5lite` command, the command's
    own start (importing JAX and TensorFlow, reading the config and the data are part of the
    wall clock the user waits through; t5lite.clock); for a later run in the same process
    (quickstart's finetuning, an ablation's next stage) or a call from Python, now."""
    from t5lite import clock
    now = time.time()
    began = clock.command_start()
    if began is None or _process_counted:
        return now
    _process_counted.append(True)
    return began if began <= now else now


class RunClock:
    """Seconds per phase of this process, and goodput over every process of the run."""

    def __init__(self, workdir: str, start_step: int, enabled=None, started: float = None):
        self.enabled = jax.process_index() == 0 if enabled is None else enabled
        self.path = epath.Path(workdir) / GOODPUT_FILE
        self.started = time.time() if started is None else started
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.loop_t0 = None
        self.interval = dict.fromkeys(PHASES, 0.0)
        self.interval_t = time.time()
        self.interval_step = start_step
        self.step = start_step
        prev = self._load()
        # steps trained after the checkpoint we restart from were lost: count them as such
        self.runs = prev.get("runs", [])
        marks = {int(k): v for k, v in prev.get("productive_at_step", {}).items()}
        prev_step = sum(r["seconds"].get("step", 0.0) for r in self.runs)
        prev_lost = sum(r["seconds"].get("lost", 0.0) for r in self.runs)
        kept = marks.get(start_step, 0.0) if start_step else 0.0
        self.seconds["lost"] = max(0.0, prev_step - prev_lost - kept) if self.runs else 0.0
        self.marks = {k: v for k, v in marks.items() if k <= start_step}
        self.kept_before = kept
        self.first_step = start_step

    def _load(self) -> dict:
        if not self.path.exists():
            return {}
        try:
            return json.loads(self.path.read_text())
        except (ValueError, OSError):  # a torn write: start the accounting afresh
            return {}

    # -- phases
    def loop_started(self) -> None:
        """Start-up ends here (state, restore, compiling nothing yet, evaluator set up)."""
        self.loop_t0 = self.interval_t = time.time()
        self.seconds["startup"] = self.loop_t0 - self.started

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] += seconds
        self.interval[phase] += seconds

    @contextlib.contextmanager
    def phase(self, name: str):
        t = time.time()
        try:
            yield
        finally:
            self.add(name, time.time() - t)

    def compiling(self, step_fn, info=print):
        """step_fn for the first step of this process: says that it compiles and how long the
        compile (with that first step) took, and counts it as compile time."""
        def run(*args):
            info("compiling the train step ...")
            t = time.time()
            out = step_fn(*args)
            jax.block_until_ready(out)
            self.add("compile", time.time() - t)
            info(f"compiled the train step in {time.time() - t:.1f}s (first step included)")
            return out
        return run

    def _productive(self) -> float:
        """Train-step seconds of this process: loop wall minus the other phases in it."""
        if self.loop_t0 is None:
            return 0.0
        s = self.seconds
        return max(0.0, time.time() - self.loop_t0 - s["compile"] - s["data"]
                   - s["checkpoint"] - s["eval"])

    # -- reports
    def interval_metrics(self, step: int) -> dict:
        """Per-step seconds since the last call (data wait, compute, checkpoint) + goodput."""
        now = time.time()
        n = max(step - self.interval_step, 1)
        i = self.interval
        wall = now - self.interval_t
        compute = max(0.0, wall - i["data"] - i["checkpoint"] - i["eval"] - i["compile"])
        out = {"data_wait_s": i["data"] / n, "compute_s": compute / n,
               "checkpoint_s": i["checkpoint"] / n, "goodput": self.summary(step)["goodput"]}
        self.interval = dict.fromkeys(PHASES, 0.0)
        self.interval_t, self.interval_step = now, step
        return out

    def checkpoint_saved(self, step: int) -> None:
        self.marks[step] = self.kept_before + self._productive()
        self.save(step)

    def _this_run(self, step: int) -> dict:
        seconds = dict(self.seconds, step=self._productive())
        return {"started": self.started, "ended": time.time(), "first_step": self.first_step,
                "last_step": step, "seconds": seconds}

    def summary(self, step: int = None) -> dict:
        """Whole-run accounting: goodput, wall / productive seconds, seconds per phase."""
        step = self.step if step is None else step
        runs = self.runs + [self._this_run(step)]
        totals = {p: sum(r["seconds"].get(p, 0.0) for r in runs) for p in PHASES}
        productive = totals["step"] - totals["lost"]
        wall = sum(r["ended"] - r["started"] for r in runs)
        downtime = sum(max(0.0, b["started"] - a["ended"]) for a, b in zip(runs, runs[1:]))
        out = {"goodput": productive / wall if wall > 0 else 0.0, "wall_s": wall,
               "productive_s": productive, "restarts": len(runs) - 1, "downtime_s": downtime}
        out.update({f"{p}_s": totals[p] for p in PHASES if p != "step"})
        return out

    def save(self, step: int) -> None:
        self.step = step
        if not self.enabled:
            return
        data = {"runs": self.runs + [self._this_run(step)],
                "productive_at_step": {str(k): v for k, v in sorted(self.marks.items())},
                "summary": self.summary(step)}
        paths.write_atomic(self.path, json.dumps(data, indent=1))

    def report(self, step: int) -> str:
        s = self.summary(step)
        parts = ", ".join(f"{p} {s[p + '_s']:.1f}s" for p in PHASES if p != "step"
                          and s[p + "_s"] >= 0.05)
        return (f"goodput {100 * s['goodput']:.1f}%: {s['productive_s']:.1f}s in train steps of "
                f"{s['wall_s']:.1f}s wall" + (f" over {s['restarts'] + 1} runs" if s["restarts"]
                                              else "") + (f" ({parts})" if parts else ""))
