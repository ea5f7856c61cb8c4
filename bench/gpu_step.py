"""One GPU: t5lite's train step vs Hugging Face eager (bf16 autocast) vs HF + torch.compile.

    python bench/gpu_step.py --out bench/gpu_step.jsonl     # on one H100 / H200, < 8 minutes
    python bench/gpu_step.py --smoke --out /tmp/smoke.jsonl # tiny presets, 2 steps, any CPU

Cases (batch x lengths): T5 v1.1 base 128 x (512, 114), T5 v1.1 large 64 x (512, 114), GPT-2
small 32 x 1024, BERT base 64 x 512 (BERT's pretraining length; 32k tokens a step, GPT-2's),
and T5 v1.1 base at 2,048 and 8,192 input tokens (32 x (2048, 456), 8 x (8192, 1824): the
tokens of the 512 case, targets in the same ratio). Every side runs in a fresh subprocess (JAX
preallocates 75% of GPU memory; torch keeps its cache): first t5lite, which also writes its
initial params with t5lite's converter (convert.t5lite_to_hf), then HF eager and HF +
torch.compile from those params, so the first-step losses must agree (to bf16 rounding).

Both sides: bf16 compute over float32 params (t5lite: model.dtype=bfloat16; HF:
torch.autocast), AdamW (constant lr 1e-4, weight decay 0.01 on matrices; torch's fused AdamW
on CUDA), dropout 0, no remat, plain cross-entropy; unpacked random-token rows without
padding. The t5lite side's config is made as `t5lite train --set` makes one (validated);
its attention: --attention-kernel (default "auto": on a GPU cuDNN where it covers the model,
else the Triton flash_gpu kernel, else xla; "attention" in the row is what ran). Steps:
--warmup untimed (the first compiles; its time is "compile_s"), then --steps timed one by one
(each waits for its result); the median is reported.
- tokens/s: T5 B x (inputs + targets), BERT B x inputs, GPT B x length (monitor/flops.py).
- MFU: t5lite's step_flops (3 x the forward's matmul FLOPs from the jaxpr of the model with
  xla attention, whatever kernel runs it; causal attention's masked half left out) / step
  time / the chip's dense bf16 peak from t5lite's chip table (mesh/topology.peak_flops: 989
  TFLOP/s for H100 / H200), by the device name jax reports; the same FLOPs for every side.
  None where the table has no peak (CPUs).
- peak memory: jax's peak_bytes_in_use / torch.cuda.max_memory_allocated (CPU: max RSS
  growth of the subprocess).
Time: each side has a timeout and the whole run a budget (--budget-s, default 450 s), spent in
the order of CASES; a side that does not fit is recorded as not run ("budget"), never guessed.
Run the rest with --cases. Output: one JSON line per case (--out) and a markdown table (stdout
and --out with .md). The parent process imports neither jax nor torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:0] = [ROOT, BENCH]

import numpy as np  # noqa: E402

from train_throughput import causal_attention_flops, hf_inputs, make_batches  # noqa: E402

SIDES = ("t5lite", "hf_eager", "hf_compile")
# name -> (family, preset size, batch, feature lengths, sides). In the order the budget is spent.
CASES = {
    "t5_base": ("t5", "base", 128, {"inputs": 512, "targets": 114}, SIDES),
    "gpt2_small": ("gpt", "small", 32, {"targets": 1024}, SIDES),
    "bert_base": ("bert", "base", 64, {"inputs": 512}, SIDES),
    "t5_large": ("t5", "large", 64, {"inputs": 512, "targets": 114}, SIDES),
    "t5_base_2k": ("t5", "base", 32, {"inputs": 2048, "targets": 456}, SIDES),
    # HF's eager T5 holds [B, H, T, T] scores per layer: expected out of memory; compiled: the same
    "t5_base_8k": ("t5", "base", 8, {"inputs": 8192, "targets": 1824}, ("t5lite", "hf_eager")),
}
SMOKE = {"t5": {"inputs": 32, "targets": 8}, "gpt": {"targets": 32}, "bert": {"inputs": 32}}
# seconds a side may run (start, imports, model, compile, steps); the budget caps them further
TIMEOUT_S = {"t5lite": 150, "hf_eager": 90, "hf_compile": 180}
MIN_SIDE_S = 20  # a side with less budget left than this is not started
TRACE_STEPS = 3  # steps under the profiler (--trace)


def case_setup(name: str, smoke: bool) -> tuple:
    """(family, preset size, batch, lengths) of a case; --smoke: the tiny preset, 2 rows."""
    family, size, batch, lengths, _ = CASES[name]
    return (family, "tiny", 2, SMOKE[family]) if smoke else (family, size, batch, lengths)


def make_config(name: str, smoke: bool, attention_kernel: str, sets=()):
    """The case's config through the config path, as `t5lite train --set` would make it: the
    preset, the bench's optimizer in full (every side trains with the same AdamW), then
    dotted overrides, then ``sets`` (--set KEY=VALUE strings, t5lite's side only: an
    experiment such as model.scan_unroll=0), validated (a bad value is refused in one line,
    as on the CLI)."""
    from t5lite import config as config_lib
    from t5lite.config import OptimizerConfig, presets
    family, size, batch, lengths = case_setup(name, smoke)
    cfg = config_lib.copy_config(
        {"t5": presets.t5_1_1, "bert": presets.bert, "gpt": presets.gpt2}[family](size))
    cfg.optim = OptimizerConfig("adamw", learning_rate=1e-4, schedule="constant",
                                warmup_steps=0, weight_decay=0.01, eps=1e-8)
    changes = {"model.dtype": "bfloat16", "model.dropout_rate": 0.0, "model.remat": "none",
               "model.attention_kernel": attention_kernel, "data.feature_lengths": lengths,
               "data.batch_size": batch, "data.pack": False, "train.z_loss": 0.0,
               "train.label_smoothing": 0.0, "train.steps": 1000}
    if family == "bert":
        changes["model.pooler"] = False  # BertForMaskedLM has no pooler
    cfg = config_lib.replace(cfg, changes)
    return config_lib.replace(cfg, list(sets)) if sets else cfg


def step_tokens(name: str, smoke: bool) -> int:
    family, _, batch, lengths = case_setup(name, smoke)
    return batch * (lengths.get("inputs", 0) + lengths.get("targets", 0))


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _timed(step, batches, warmup: int, steps: int, sync) -> dict:
    """The first step (loss, and its time: compile + run), warmup - 1 more, then ``steps``
    steps each timed to its result; the median."""
    t0 = time.perf_counter()
    loss0 = float(sync(step(batches[0])))
    compile_s = time.perf_counter() - t0
    for i in range(1, warmup):
        sync(step(batches[i % len(batches)]))
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        sync(step(batches[(i + 1) % len(batches)]))
        times.append(time.perf_counter() - t0)
    return dict(loss0=loss0, compile_s=compile_s, step_s=float(np.median(times)),
                step_min_s=min(times), step_max_s=max(times))


# ------------------------------------------------------------------------------ t5lite (JAX)


def run_t5lite(args) -> dict:
    import jax

    from t5lite import convert, peft
    from t5lite.config import MeshConfig
    from t5lite.mesh import partitioning, topology
    from t5lite.models import gpu_attention
    from t5lite.train import optim, trainer
    base = _rss_mib()
    cfg = make_config(args.case, args.smoke, args.attention_kernel, args.set)
    device = jax.devices()[0]
    mesh = partitioning.make_mesh(MeshConfig(), [device])
    model = peft.build_model(cfg.model)
    tx = optim.optimizer_for(cfg, cfg.train.steps)
    abstract, _, _ = trainer.abstract_train_state(cfg, model, mesh, tx)
    flops = trainer.step_flops(cfg, model, mesh, abstract.params, cfg.data.batch_size)
    flops -= 3 * causal_attention_flops(cfg)
    state, shardings = trainer.create_train_state(cfg, model, mesh, tx)
    convert.t5lite_to_hf(cfg, jax.device_get(state.params), args.hf_dir)  # before donation
    family = CASES[args.case][0]
    batches = [partitioning.global_batch(b, partitioning.batch_sharding(mesh)) for b in
               make_batches(family, cfg.model.vocab_size, cfg.data.batch_size,
                            cfg.data.feature_lengths)]
    train_step = trainer.make_train_step(cfg, model, tx, mesh, shardings)
    box = {"state": state}

    def step(b):
        box["state"], metrics = train_step(box["state"], b)
        return metrics["loss"]

    timing = _timed(step, batches, args.warmup, args.steps, jax.block_until_ready)
    if args.trace_dir:
        try:  # a profiler that cannot run on this machine costs the profile, not the row
            timing["profile"] = _profile(step, batches, args.trace_dir, timing["step_s"])
        except Exception as e:  # noqa: BLE001 - recorded in the row, whatever it is
            timing["profile"] = dict(error=f"{type(e).__name__}: {e}"[:300])
    stats = device.memory_stats() or {}
    peak = (stats["peak_bytes_in_use"] / 2 ** 20 if "peak_bytes_in_use" in stats
            else _rss_mib() - base)
    return dict(timing, peak_mib=peak, flops=flops, device=device.device_kind,
                peak_flops=topology.peak_flops(device.device_kind), jax=jax.__version__,
                attention_kernel=cfg.model.attention_kernel,  # as configured; what ran:
                attention=gpu_attention.resolve(cfg.model, deterministic=False),
                params=sum(x.size for x in jax.tree.leaves(abstract.params)))


def _profile(step, batches, trace_dir: str, step_s: float) -> dict:
    """TRACE_STEPS more steps under jax.profiler.trace (after the timed ones, so the timing
    is untouched), summarized by bench/gpu_profile.py into trace_dir/profile.json."""
    import glob

    import jax

    import gpu_profile
    with jax.profiler.trace(os.path.join(trace_dir, "xplane")):
        for i in range(TRACE_STEPS):
            jax.block_until_ready(step(batches[i % len(batches)]))
    path = sorted(glob.glob(os.path.join(trace_dir, "xplane", "**", "*.xplane.pb"),
                            recursive=True))[-1]
    summary = gpu_profile.summarize(path, TRACE_STEPS, step_s * 1e3)
    with open(os.path.join(trace_dir, "profile.json"), "w") as f:
        json.dump(dict(summary, xplane=path), f, indent=1)
    return dict(kernel_ms=summary["kernel_ms_per_step"], classes=summary["classes"])


# -------------------------------------------------------------------------- HF PyTorch


def run_hf(args) -> dict:
    import torch
    import transformers
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    family = CASES[args.case][0]
    cls = {"t5": transformers.T5ForConditionalGeneration, "bert": transformers.BertForMaskedLM,
           "gpt": transformers.GPT2LMHeadModel}[family]
    base = _rss_mib()
    model = cls.from_pretrained(args.hf_dir, dtype=torch.float32).to(dev)
    model.train()
    cfg = make_config(args.case, args.smoke, "xla")
    batches = [{k: v.to(dev) for k, v in hf_inputs(family, b).items()} for b in make_batches(
        family, cfg.model.vocab_size, cfg.data.batch_size, cfg.data.feature_lengths)]
    decay = [p for p in model.parameters() if p.ndim >= 2]  # as optim.decay_mask
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.optim.weight_decay},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=cfg.optim.learning_rate, betas=(cfg.optim.b1, cfg.optim.b2),
                            eps=cfg.optim.eps, fused=cuda)
    forward = torch.compile(model) if args.child == "hf_compile" else model

    def step(b):
        with torch.autocast(dev, dtype=torch.bfloat16):
            loss = forward(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def sync(loss):
        if cuda:
            torch.cuda.synchronize()
        return loss

    timing = _timed(step, batches, args.warmup, args.steps, sync)
    peak = torch.cuda.max_memory_allocated() / 2 ** 20 if cuda else _rss_mib() - base
    return dict(timing, peak_mib=peak, torch=torch.__version__,
                attention=model.config._attn_implementation,
                device=torch.cuda.get_device_name() if cuda else "cpu")


# ------------------------------------------------------------------------------- driver


def _failure(stderr: str) -> str:
    """One line for a failed side: out of memory, or the last exception line (JAX appends a
    note on its filtered traceback after it), else the last line."""
    if "RESOURCE_EXHAUSTED" in stderr or "OutOfMemoryError" in stderr or "out of memory" in \
            stderr.lower():
        return "out of memory"
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if re.match(r"[\w.]+(Error|Exception)\b.*: ", ln)]
    return (errors or lines or ["failed with no message"])[-1][:300]


def run_side(side: str, name: str, args, hf_dir: str, timeout: float) -> dict:
    """One side in a fresh subprocess (its own process group, killed whole on timeout:
    torch.compile starts worker processes)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--cases", name,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--hf-dir", hf_dir,
           "--attention-kernel", args.attention_kernel] + (["--smoke"] if args.smoke else [])
    cmd += [f"--set={item}" for item in args.set]
    env = dict(os.environ)
    if side == "t5lite" and name == args.trace:
        # the trace, and XLA's optimized HLO beside it (the kernels' ops are named there)
        os.makedirs(args.trace_dir, exist_ok=True)
        cmd += ["--trace-dir", args.trace_dir]
        env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), "--xla_dump_hlo_as_text",
                                     f"--xla_dump_to={os.path.join(args.trace_dir, 'hlo')}",
                                     "--xla_dump_hlo_module_re=jit_step_fn"]).strip()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return dict(error=f"timeout after {timeout:.0f} s", wall_s=time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    if proc.returncode:
        if args.failures:  # the whole story of a failed side, for whoever reads the run
            with open(args.failures, "a") as f:
                f.write(f"==== {name} / {side} (rc {proc.returncode})\n{err[-20000:]}\n")
        return dict(error=_failure(err), wall_s=wall)
    return dict(json.loads(out.strip().splitlines()[-1]), wall_s=wall)


def run_case(name: str, args, deadline: float) -> dict:
    """Every side of one case, within the budget left; the row with tokens/s and MFU."""
    sides = {}
    with tempfile.TemporaryDirectory() as hf_dir:
        for side in CASES[name][4]:
            if side not in args.sides:
                continue
            left = deadline - time.perf_counter()
            if left < MIN_SIDE_S:
                sides[side] = dict(error="not run: over the run's time budget (--budget-s)")
            elif side != "t5lite" and "error" in sides.get("t5lite", {}):
                sides[side] = dict(error="not run: t5lite's side (which writes the params) "
                                         "failed")
            else:
                sides[side] = run_side(side, name, args, hf_dir, min(TIMEOUT_S[side], left))
            if side == "t5lite" and "error" in sides[side] and args.attention_kernel != "xla" \
                    and deadline - time.perf_counter() >= MIN_SIDE_S:
                # the kernel failed here: the row is xla's, and says what the kernel did
                failed = sides[side]
                xla = argparse.Namespace(**dict(vars(args), attention_kernel="xla"))
                sides[side] = run_side(side, name, xla, hf_dir, min(
                    TIMEOUT_S[side], deadline - time.perf_counter()))
                sides[side]["instead_of"] = f"{args.attention_kernel}: {failed['error']}"
    ours = sides.get("t5lite", {})
    flops, peak = ours.get("flops"), ours.get("peak_flops")
    tokens = step_tokens(name, args.smoke)
    for result in sides.values():
        if "step_s" in result:
            result["tokens_per_s"] = tokens / result["step_s"]
            result["mfu"] = flops / result["step_s"] / peak if flops and peak else None
    family, size, batch, lengths = case_setup(name, args.smoke)
    return dict(case=name, family=family, preset=size, batch=batch, lengths=lengths,
                tokens_per_step=tokens, smoke=args.smoke, sides=sides, set=args.set)


def markdown(rows: list) -> str:
    head = ("| case | B x lengths | side | step ms | tokens/s | MFU | peak GiB | compile s | "
            "first loss | attention |")
    out = [head, "|" + "---|" * 10]
    for row in rows:
        shape = f"{row['batch']} x " + " + ".join(str(v) for v in row["lengths"].values())
        for side, r in row["sides"].items():
            if side == "t5lite" and row.get("set"):
                side += " --set " + " --set ".join(row["set"])
            if "error" in r:
                out.append(f"| {row['case']} | {shape} | {side} | {r['error']} |||||||")
                continue
            mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "-"
            out.append(f"| {row['case']} | {shape} | {side} | {r['step_s'] * 1e3:.1f} | "
                       f"{r['tokens_per_s']:,.0f} | {mfu} | {r['peak_mib'] / 1024:.2f} | "
                       f"{r['compile_s']:.1f} | {r['loss0']:.4f} | {r.get('attention', '')}"
                       + (f" ({r['instead_of'][:60]})" if "instead_of" in r else "") + " |")
    return "\n".join(out)


def attention_kernels() -> tuple:
    """model.attention_kernel's choices (the config schema; imports no jax)."""
    import dataclasses

    from t5lite.config import ModelConfig
    return {f.name: f for f in dataclasses.fields(ModelConfig)}["attention_kernel"].metadata[
        "choices"]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="", help="JSON lines file (a markdown table beside: .md)")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: "
                   + ", ".join(CASES))
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated, of: "
                   + ", ".join(SIDES))
    p.add_argument("--smoke", action="store_true",
                   help="tiny presets, 2 rows, 2 steps (CPU test of the whole path)")
    p.add_argument("--steps", type=int, default=0, help="timed steps (0: 10, smoke 2)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (compile)")
    p.add_argument("--attention-kernel", default="auto", choices=attention_kernels(),
                   help="t5lite's model.attention_kernel (auto: the fastest kernel that covers "
                   "the model on this backend; the row records what ran)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a t5lite config override for t5lite's side (repeatable), e.g. "
                   "model.scan_unroll=0; the rows record it")
    p.add_argument("--budget-s", type=float, default=450.0, help="the whole run's seconds")
    p.add_argument("--trace", default="", help="a case whose t5lite side is profiled "
                   f"({TRACE_STEPS} steps after the timed ones) into --trace-dir: the "
                   "trace, its summary (bench/gpu_profile.py) and XLA's optimized HLO")
    p.add_argument("--trace-dir", default="", help="where --trace writes")
    p.add_argument("--failures", default="", help="a file that gets each failed side's stderr")
    p.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--hf-dir", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.steps = args.steps or (2 if args.smoke else 10)
    args.warmup = 1 if args.smoke else args.warmup
    args.sides = args.sides.split(",")
    if args.trace and not args.trace_dir and not args.child:
        p.error("--trace needs --trace-dir")
    for name in args.cases.split(",") + args.sides:
        if name not in CASES and name not in SIDES:
            p.error(f"unknown case or side {name!r}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        args.case = args.cases
        print(json.dumps((run_t5lite if args.child == "t5lite" else run_hf)(args)))
        return
    deadline = time.perf_counter() + args.budget_s
    rows = []
    out = open(args.out, "w") if args.out else None
    for name in args.cases.split(","):
        row = run_case(name, args, deadline)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
    table = markdown(rows)
    print(table)
    if out:
        out.close()
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
