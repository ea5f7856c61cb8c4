"""A jax.profiler trace of the training steps a user picks (train.profile_steps)."""

from __future__ import annotations

import contextlib
import os

import jax

from t5lite.errors import UserError


def parse_steps(spec: str) -> tuple[int, int] | None:
    """train.profile_steps "A:B" -> (A, B): trace the updates after step A up to step B."""
    if not spec:
        return None
    try:
        a, b = (int(x) for x in spec.split(":"))
    except ValueError:
        a = b = -1
    if not 0 <= a < b:
        raise UserError(f"train.profile_steps={spec!r}: use 'A:B' with 0 <= A < B, e.g. '10:15' "
                        "traces steps 11 to 15 (skip the first steps: they compile).")
    return a, b


class Profiler:
    """jax.profiler trace of the steps in train.profile_steps, written to WORKDIR/profile/ on
    process 0 (TensorBoard's profile plugin reads it; Perfetto reads *.trace.json.gz)."""

    def __init__(self, spec: str, workdir: str, info=print):
        self.window = parse_steps(spec)
        self.dir = os.path.join(workdir, "profile")
        self.info = info
        self.active = False
        self.enabled = self.window is not None and jax.process_index() == 0

    def before_step(self, step: int) -> None:
        if self.enabled and not self.active and step == self.window[0]:
            jax.profiler.start_trace(self.dir, create_perfetto_trace=True)
            self.active = True
            self.info(f"profiling steps {step + 1}-{self.window[1]} -> {self.dir}")

    def annotate(self, step: int):
        """Marks one step in the trace (TensorBoard's step-time view groups by it)."""
        if not self.active:
            return contextlib.nullcontext()
        return jax.profiler.StepTraceAnnotation("train", step_num=step)

    def after_step(self, step: int, outputs) -> None:
        """step: updates done so far. Stops (after the device finished) at the window's end."""
        if self.active and step >= self.window[1]:
            self.stop(outputs)

    def stop(self, outputs=None) -> None:
        if not self.active:
            return
        if outputs is not None:
            jax.block_until_ready(outputs)
        jax.profiler.stop_trace()
        self.active = False
        self.info(f"profile written to {self.dir}: `tensorboard --logdir {self.dir}` (Profile "
                  "tab, needs tensorboard-plugin-profile) or open its *.trace.json.gz in "
                  "https://ui.perfetto.dev")
