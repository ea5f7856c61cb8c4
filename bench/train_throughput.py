"""Train-step throughput, MFU and peak memory: t5lite (JAX) vs Hugging Face PyTorch, same models.

    python bench/train_throughput.py [--families t5,bert,gpt] [--sizes tiny,small]
        [--steps 0] [--warmup 1] [--batch 0] [--dropout 0.0] [--peak-flops 0]

For each family and size, one fresh subprocess runs our real train step (trainer.make_train_step:
jitted forward + backward + AdamW, state donated, as `t5lite train` runs it) and a second one
the same model in transformers (float32, eager PyTorch, torch.optim.AdamW), each on the same
synthetic random-token batches of fixed shapes. The HF model is our initial params exported
with convert.t5lite_to_hf, so the first-step losses must agree (printed as a check that both
sides compute the same model). Each side warms up (ours: XLA compile) and then times --steps
steps one by one (each waits for its result), reporting the median step time: on a shared
2-core box one slow step (another job, the page cache) then moves neither side's number.

- tokens/s: encoder inputs + decoder targets per step (as the trainer counts them):
  T5 B x (inputs + targets), BERT B x inputs, GPT B x targets; the same count for both sides.
- MFU: model FLOPs per step / step time / peak FLOP/s. Model FLOPs = trainer.step_flops
  (3 x the forward pass's matmul FLOPs, from its jaxpr) with causal self-attention's score and
  value matmuls halved; the same number for both sides. Peak: --peak-flops, else measured here
  as the best float32 jnp.dot 2048x2048 rate on this machine (said in the output).
- peak memory: the device's peak_bytes_in_use where JAX reports memory_stats (accelerators),
  else (CPU; always for HF) the subprocess's max RSS (getrusage) minus its RSS after imports:
  params, optimizer state, activations, compiled code and allocator slack.
- malloc: both sides run with glibc's default malloc, as `t5lite train` does. To try other
  glibc settings on both, set them from the shell, e.g. MALLOC_ARENA_MAX=1
  MALLOC_MMAP_THRESHOLD_=536870912 MALLOC_TRIM_THRESHOLD_=536870912 (keeps freed blocks up to
  512 MiB, so steps do not page-fault their buffers back in); the children inherit them.
Sizes: tiny = the configs/*_tiny presets (8k vocab), batch 32; small = T5 v1.1 small (77M),
BERT base (110M: the repo has no BERT small; it is GPT-2 small's shape) and GPT-2 small
(124M), batch 4 (so that the whole default run stays near 10 minutes on 2 cores). Lengths:
T5 inputs 128 / targets 32, BERT and GPT 128. All float32, as the AdamW update is; dropout 0
in both by default (--dropout sets it in both), so the first-step losses compare.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

FAMILIES = ("t5", "bert", "gpt")
SIZES = ("tiny", "small")
TIMED_STEPS = {"tiny": 12, "small": 4}  # --steps 0: ~3-4 s of timed steps per side at tiny
# (preset size, batch, feature lengths) per family and bench size
CASES = {
    ("t5", "tiny"): ("tiny", 32, {"inputs": 128, "targets": 32}),
    ("t5", "small"): ("small", 4, {"inputs": 128, "targets": 32}),
    ("bert", "tiny"): ("tiny", 32, {"inputs": 128}),
    ("bert", "small"): ("base", 4, {"inputs": 128}),
    ("gpt", "tiny"): ("tiny", 32, {"targets": 128}),
    ("gpt", "small"): ("small", 4, {"targets": 128}),
}
MASK_RATE = 0.15  # BERT: fraction of positions masked (and scored)


def make_config(family: str, size: str, batch: int, dropout: float, scan_unroll: int = -1):
    """The preset, in float32, trained by AdamW (constant lr) on plain cross-entropy (no z-loss,
    no label smoothing) so that torch.optim.AdamW + HF's loss do the same arithmetic."""
    import dataclasses

    from t5lite.config import OptimizerConfig
    from t5lite.models import presets
    preset, default_batch, lengths = CASES[(family, size)]
    cfg = {"t5": presets.t5_1_1, "bert": presets.bert, "gpt": presets.gpt2}[family](preset)
    model = dict(dtype="float32", dropout_rate=dropout, remat="none")
    if scan_unroll >= 0:
        model["scan_unroll"] = scan_unroll
    if family == "bert":
        model["pooler"] = False  # BertForMaskedLM has no pooler (the MLM loss never reads it)
    return dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model, **model),
        data=dataclasses.replace(cfg.data, feature_lengths=lengths,
                                 batch_size=batch or default_batch, pack=False),
        optim=OptimizerConfig("adamw", learning_rate=1e-4, schedule="constant", warmup_steps=0,
                              weight_decay=0.01, eps=1e-8),
        train=dataclasses.replace(cfg.train, z_loss=0.0, label_smoothing=0.0, steps=1000))


def make_batches(family: str, vocab: int, batch: int, lengths: dict, n: int = 2) -> list:
    """n host batches (ours: the contract's keys, unpacked rows without padding)."""
    rng = np.random.default_rng(0)
    tok = lambda *s: rng.integers(2, vocab, size=s).astype(np.int32)  # noqa: E731
    ones = lambda L: np.ones((batch, L), np.int32)  # noqa: E731
    pos = lambda L: np.broadcast_to(np.arange(L, dtype=np.int32), (batch, L)).copy()  # noqa
    out = []
    for _ in range(n):
        if family == "t5":
            li, lt = lengths["inputs"], lengths["targets"]
            targets = tok(batch, lt)
            shifted = np.concatenate([np.zeros((batch, 1), np.int32), targets[:, :-1]], 1)
            out.append(dict(encoder_input_tokens=tok(batch, li), encoder_segment_ids=ones(li),
                            encoder_positions=pos(li), decoder_input_tokens=shifted,
                            decoder_target_tokens=targets, decoder_loss_weights=ones(lt),
                            decoder_segment_ids=ones(lt), decoder_positions=pos(lt)))
        elif family == "bert":
            L = lengths["inputs"]
            targets = tok(batch, L)
            masked = (rng.random((batch, L)) < MASK_RATE).astype(np.int32)
            inputs = np.where(masked, vocab - 1, targets).astype(np.int32)
            out.append(dict(encoder_input_tokens=inputs, encoder_target_tokens=targets,
                            encoder_loss_weights=masked, encoder_segment_ids=ones(L),
                            encoder_positions=pos(L),
                            encoder_token_type_ids=np.zeros((batch, L), np.int32)))
        else:
            L = lengths["targets"]
            row = tok(batch, L + 1)
            weights = ones(L)
            weights[:, -1] = 0  # HF shifts labels inside: it scores L - 1 positions per row
            out.append(dict(decoder_input_tokens=row[:, :-1], decoder_target_tokens=row[:, 1:],
                            decoder_loss_weights=weights, decoder_segment_ids=ones(L),
                            decoder_positions=pos(L)))
    return out


def step_tokens(family: str, batch: dict) -> int:
    keys = {"t5": ("encoder_input_tokens", "decoder_target_tokens"),
            "bert": ("encoder_input_tokens",), "gpt": ("decoder_target_tokens",)}[family]
    return sum(batch[k].size for k in keys)


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _time_steps(step, first, batches, steps, sync=lambda out: out):
    """Run `first` (warm-up, returns the loss of step 1), then `steps` steps (starting on the
    batch after the warm-up's first), each timed on its own: `sync` waits for its result (JAX
    dispatches asynchronously). Returns the loss and the step times in seconds."""
    loss0 = first()
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        sync(step(batches[(i + 1) % len(batches)]))
        times.append(time.perf_counter() - t0)
    return loss0, times


def _timing(times: list) -> dict:
    """step_s: the median step (robust to a noisy neighbour); the spread for the record."""
    return dict(step_s=float(np.median(times)), step_min_s=min(times), step_max_s=max(times))


# ------------------------------------------------------------------------------ ours (JAX)


def causal_attention_flops(cfg) -> int:
    """Forward matmul FLOPs of the upper (masked) half of every causal self-attention: the
    score (q.k) and weighted-value matmuls, 2 x 2 B H L^2 K per layer; halved."""
    m = cfg.model
    if m.architecture not in ("encoder_decoder", "decoder_only"):
        return 0
    L = cfg.data.feature_lengths["targets"]
    return m.num_decoder_layers * 2 * cfg.data.batch_size * m.num_heads * L * L * m.head_dim


def run_ours(args) -> dict:
    import jax

    from t5lite import convert
    from t5lite.config import MeshConfig
    from t5lite import peft
    from t5lite.mesh import partitioning
    from t5lite.train import optim, trainer
    base = _rss_mib()
    cfg = make_config(args.family, args.size, args.batch, args.dropout, args.scan_unroll)
    devices = jax.devices()[:1]  # one CPU device using every core (XLA's intra-op pool)
    mesh = partitioning.make_mesh(MeshConfig(), devices)
    model = peft.build_model(cfg.model)
    tx = optim.optimizer_for(cfg, cfg.train.steps)
    abstract, _, _ = trainer.abstract_train_state(cfg, model, mesh, tx)
    flops = trainer.step_flops(cfg, model, mesh, abstract.params, cfg.data.batch_size)
    flops -= 3 * causal_attention_flops(cfg)
    batches = make_batches(args.family, cfg.model.vocab_size, cfg.data.batch_size,
                           cfg.data.feature_lengths)
    bsh = partitioning.batch_sharding(mesh)
    dev_batches = [partitioning.global_batch(b, bsh) for b in batches]
    state, shardings = trainer.create_train_state(cfg, model, mesh, tx)
    train_step = trainer.make_train_step(cfg, model, tx, mesh, shardings)
    box = {"state": state}

    def step(b):
        box["state"], metrics = train_step(box["state"], b)
        return metrics

    def first():
        t0 = time.perf_counter()
        loss0 = float(step(dev_batches[0])["loss"])  # compiles
        box["compile_s"] = time.perf_counter() - t0
        for i in range(1, args.warmup):
            jax.block_until_ready(step(dev_batches[i % 2]))
        return loss0

    loss0, times = _time_steps(step, first, dev_batches, args.steps, jax.block_until_ready)
    stats = devices[0].memory_stats() or {}  # accelerators; None on CPU: process RSS instead
    peak = (stats["peak_bytes_in_use"] / 2 ** 20 if "peak_bytes_in_use" in stats
            else _rss_mib() - base)
    compile_s = box["compile_s"]
    del box, state
    if args.hf_dir:  # the same initial params (deterministic init), for the HF side
        init, _ = trainer.create_train_state(cfg, model, mesh, tx)
        convert.t5lite_to_hf(cfg, jax.device_get(init.params), args.hf_dir)
    return dict(**_timing(times), loss0=loss0, peak_mib=peak, flops=flops, compile_s=compile_s,
                params=sum(x.size for x in jax.tree.leaves(abstract.params)))


# -------------------------------------------------------------------------- HF PyTorch


def run_hf(args) -> dict:
    import torch
    import transformers
    torch.set_num_threads(args.hf_threads or os.cpu_count())
    cls = {"t5": transformers.T5ForConditionalGeneration, "bert": transformers.BertForMaskedLM,
           "gpt": transformers.GPT2LMHeadModel}[args.family]  # (imports the modeling code)
    base = _rss_mib()
    model = cls.from_pretrained(args.hf_dir, dtype=torch.float32)
    model.train()
    cfg = make_config(args.family, args.size, args.batch, args.dropout)
    batches = [hf_inputs(args.family, b) for b in make_batches(
        args.family, cfg.model.vocab_size, cfg.data.batch_size, cfg.data.feature_lengths)]
    decay = [p for p in model.parameters() if p.ndim >= 2]  # as optim.decay_mask
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.optim.weight_decay},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=cfg.optim.learning_rate, betas=(cfg.optim.b1, cfg.optim.b2),
                            eps=cfg.optim.eps)

    def step(b):
        loss = model(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def first():
        loss0 = float(step(batches[0]))  # allocates the AdamW state
        for i in range(1, args.warmup):
            step(batches[i % 2])
        return loss0

    loss0, times = _time_steps(step, first, batches, args.steps)
    return dict(**_timing(times), loss0=loss0, peak_mib=_rss_mib() - base,
                attn=model.config._attn_implementation, threads=torch.get_num_threads())


def hf_inputs(family: str, b: dict) -> dict:
    import torch
    t = lambda x: torch.from_numpy(np.asarray(x, np.int64))  # noqa: E731
    if family == "t5":
        return dict(input_ids=t(b["encoder_input_tokens"]),
                    attention_mask=t(b["encoder_segment_ids"]),
                    decoder_input_ids=t(b["decoder_input_tokens"]),
                    decoder_attention_mask=t(b["decoder_segment_ids"]),
                    labels=t(b["decoder_target_tokens"]))
    if family == "bert":
        labels = np.where(b["encoder_loss_weights"] > 0, b["encoder_target_tokens"], -100)
        return dict(input_ids=t(b["encoder_input_tokens"]),
                    attention_mask=t(b["encoder_segment_ids"]),
                    token_type_ids=t(b["encoder_token_type_ids"]), labels=t(labels))
    return dict(input_ids=t(b["decoder_input_tokens"]),
                attention_mask=t(b["decoder_segment_ids"]), labels=t(b["decoder_input_tokens"]))


# ------------------------------------------------------------------------------- driver


def measure_peak_flops(reps: int = 10) -> float:
    """Best float32 FLOP/s of a jitted 2048x2048 jnp.dot on the default (CPU) device."""
    import jax
    import jax.numpy as jnp
    n = 2048
    x = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(jnp.dot)
    f(x, x).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f(x, x).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def child(side: str, family: str, size: str, args, hf_dir: str) -> dict:
    steps = args.steps or TIMED_STEPS[size]
    cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--families", family,
           "--sizes", size, "--steps", str(steps), "--warmup", str(args.warmup),
           "--batch", str(args.batch), "--hf-threads", str(args.hf_threads),
           "--dropout", str(args.dropout), "--scan-unroll", str(args.scan_unroll),
           "--hf-dir", hf_dir]
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{side} {family} {size} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--sizes", default=",".join(SIZES))
    p.add_argument("--steps", type=int, default=0,
                   help="timed steps per side (0: tiny 12, small 4; the median is reported)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed steps per side before them (ours: the first one compiles)")
    p.add_argument("--batch", type=int, default=0, help="batch size (0: tiny 32, small 4)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout rate in both models")
    p.add_argument("--scan-unroll", type=int, default=-1,
                   help="ours: model.scan_unroll (-1: the preset's; 0: unroll every layer)")
    p.add_argument("--hf-threads", type=int, default=0,
                   help="torch intra-op threads (0: os.cpu_count(), the cores XLA uses). On a "
                        "machine shared with other jobs, 1 can be faster: torch's OpenMP "
                        "threads wait for each other at every op")
    p.add_argument("--peak-flops", type=float, default=0.0,
                   help="peak FLOP/s for MFU (0: measure a float32 2048^2 jnp.dot)")
    p.add_argument("--child", choices=("ours", "hf"), help=argparse.SUPPRESS)
    p.add_argument("--hf-dir", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        args.family, args.size = args.families, args.sizes
        args.steps = args.steps or TIMED_STEPS[args.size]
        print(json.dumps((run_ours if args.child == "ours" else run_hf)(args)))
        return
    families, sizes = args.families.split(","), args.sizes.split(",")
    for f in families:
        if f not in FAMILIES:
            p.error(f"unknown family {f!r}; choose from {', '.join(FAMILIES)}")
    for s in sizes:
        if s not in SIZES:
            p.error(f"unknown size {s!r}; choose from {', '.join(SIZES)}")
    import jax
    peak = args.peak_flops or measure_peak_flops()
    how = "--peak-flops" if args.peak_flops else "measured float32 jnp.dot 2048x2048"
    print(f"{os.cpu_count()} CPU cores, jax {jax.__version__} ({jax.devices()[0].platform}); "
          f"peak {peak / 1e9:.1f} GFLOP/s ({how}); torch threads "
          f"{args.hf_threads or os.cpu_count()}; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    rows = []
    for family in families:
        for size in sizes:
            with tempfile.TemporaryDirectory() as hf_dir:
                ours = child("ours", family, size, args, hf_dir)
                hf = child("hf", family, size, args, hf_dir)
            cfg = make_config(family, size, args.batch, args.dropout)
            batch = make_batches(family, 8, cfg.data.batch_size, cfg.data.feature_lengths, 1)[0]
            tokens = step_tokens(family, batch)
            shape = "x".join(str(v) for v in [cfg.data.batch_size,
                                              *cfg.data.feature_lengths.values()])
            row = dict(family=family, size=size, shape=shape, params=ours["params"],
                       ours_tps=tokens / ours["step_s"], hf_tps=tokens / hf["step_s"],
                       ours_mfu=ours["flops"] / ours["step_s"] / peak,
                       hf_mfu=ours["flops"] / hf["step_s"] / peak,
                       ours_mib=ours["peak_mib"], hf_mib=hf["peak_mib"],
                       loss=(ours["loss0"], hf["loss0"]), attn=hf["attn"])
            row["ratio"] = row["ours_tps"] / row["hf_tps"]
            rows.append(row)
            print(json.dumps(dict(row, ours=ours, hf=hf)), flush=True)
    print_table(rows)
    print("load average at the end " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


def print_table(rows):
    head = (f"{'family':6} {'size':5} {'params':>6} {'B x lengths':12} {'ours tok/s':>10} "
            f"{'HF tok/s':>9} {'ratio':>6} {'ours MFU':>8} {'HF MFU':>7} {'ours MiB':>8} "
            f"{'HF MiB':>7} {'loss0 ours/HF':>15}  HF attn")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['family']:6} {r['size']:5} {r['params'] / 1e6:5.1f}M {r['shape']:12} "
              f"{r['ours_tps']:10.0f} {r['hf_tps']:9.0f} {r['ratio']:5.2f}x "
              f"{r['ours_mfu']:8.1%} {r['hf_mfu']:7.1%} {r['ours_mib']:8.0f} {r['hf_mib']:7.0f} "
              f"{r['loss'][0]:7.4f}/{r['loss'][1]:7.4f}  {r['attn']}")
    print("goal: ours >= 1.5x HF tokens/s per family: " + ", ".join(
        f"{r['family']} {r['size']} {'met' if r['ratio'] >= 1.5 else 'MISSED'}" for r in rows))


if __name__ == "__main__":
    main()
