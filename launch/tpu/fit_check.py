"""The fit check: compile the train step for the slice on this machine (`t5lite compile
--json`) before anything is rented or started, and refuse a config that does not fit, naming
the `--set` changes that would help."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .layout import REPO_ROOT
from .messages import LaunchError, note


def _gib(n) -> str:
    return f"{n / 2 ** 30:.1f}"


def compile_report(config: str, accelerator_type: str, overrides: list[str]) -> dict:
    """`t5lite compile --json`'s report for the config on the slice. Its failures (no libtpu,
    an unknown topology: t5lite's one-line error) become a LaunchError."""
    cmd = [sys.executable, "-m", "t5lite.cli", "compile", "--config", config,
           "--topology", accelerator_type]
    for item in overrides:
        cmd += ["--set", item]
    cmd.append("--json")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p))
    # Only one process may load libtpu unless this is set; the compile targets an abstract
    # topology and never opens a TPU, so it may run beside another compile or test.
    env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=env)
    last = (r.stderr.strip().splitlines() or [""])[-1]
    if r.returncode != 0:
        if "No module named" in r.stderr:
            raise LaunchError("the fit check compiles for the TPU on this machine and needs "
                              "t5lite's dependencies with jax[tpu] (libtpu): pip install -e "
                              f"'.[tpu]' (or pass --skip-fit-check). ({last})")
        last = last.removeprefix("t5lite: error: ")
        raise LaunchError(f"fit check failed: {last} (or pass --skip-fit-check)")
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise LaunchError("fit check: `t5lite compile --json` printed no JSON "
                          "(pass --skip-fit-check to start anyway)") from None


def fit_check(args, accelerator_type: str) -> None:
    """Compile the train step for the slice here and refuse what won't fit. A program XLA
    refuses to compile (out of memory) comes back as a report with fits=false and XLA's
    figure as the total."""
    if args.skip_fit_check:
        return
    if not accelerator_type:
        note("(dry run) no --accelerator-type: fit check skipped")
        return
    note(f"fit check: compiling {args.config} for {accelerator_type} on this machine "
         "(--skip-fit-check skips it)")
    report = compile_report(args.config, accelerator_type, args.set or [])
    per_chip = report.get("bytes_per_chip") or {}
    hbm = report.get("hbm_bytes_per_chip") or 0
    used = f"{_gib(per_chip.get('total', 0))} of {_gib(hbm)} GiB HBM per chip"
    if report.get("fits"):
        extra = ""
        # expected_*: t5lite compile's expected step; est_*: an older compile's bound
        step = report.get("expected_step_seconds") or report.get("est_step_seconds")
        mfu = report.get("expected_mfu") or report.get("est_mfu")
        if step:
            extra = f"; expected step {step:.3g} s"
        if mfu:
            extra += f", MFU {100 * mfu:.0f}%"
        note(f"fit check: fits {accelerator_type}: {used}{extra}")
        return
    if report.get("compiled") is False:
        used += " (XLA refused to compile the step)"
    raise LaunchError(f"{args.config} does not fit {accelerator_type}: {used} (params "
                      f"{_gib(per_chip.get('params', 0))}, optimizer "
                      f"{_gib(per_chip.get('opt_state', 0))}, temporaries "
                      f"{_gib(per_chip.get('temp', 0))}). Try "
                      + "; ".join(fit_fixes(report, args.set or []))
                      + f"; `t5lite compile --config {args.config} --topology {accelerator_type}"
                      " --search` ranks the settings that fit. Or pass --skip-fit-check.")


def fit_fixes(report: dict, overrides: list[str]) -> list[str]:
    """The --set changes that shrink what the compile report says is too big."""
    sets = dict(item.split("=", 1) for item in overrides if "=" in item)
    remat = report.get("remat", sets.get("model.remat"))
    accum = int(report.get("grad_accum_steps", sets.get("train.grad_accum_steps", 1)))
    per_chip = report.get("bytes_per_chip") or {}
    chips = int(report.get("chips") or 1)
    mesh = report.get("mesh") or {}
    if isinstance(mesh, (list, tuple)):
        mesh = dict(mesh)
    tensor = int(mesh.get("tensor", 1) or 1)
    fixes = []
    state = per_chip.get("params", 0) + per_chip.get("opt_state", 0)
    if int(mesh.get("fsdp", 1) or 1) * tensor < chips:
        fixes.append(f"--set mesh.fsdp={chips // tensor} --set mesh.data=1 (shard parameters and "
                     f"optimizer state over all {chips} chips)")
    if per_chip.get("temp", 0) >= 0.25 * state:
        if remat != "full":
            fixes.append("--set model.remat=full (recompute activations in the backward pass)")
        fixes.append(f"--set train.grad_accum_steps={accum * 2} (smaller micro-batches)")
    return fixes or ["a larger slice"]
