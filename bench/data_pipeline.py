"""Input pipeline throughput vs the train step's appetite (tiny T5, span corruption, packed).

    python bench/data_pipeline.py [--config quickstart] [--batches 100] [--steps 20]

1. seqio pipeline (t5lite.tasks.pipeline.get_dataset: read, tokenize, span corruption, pack,
   batch) for the config's task / feature lengths / batch size: tokens per second (non-padding
   encoder inputs + decoder targets, as the trainer counts them), after a warm-up.
2. The jitted train step (t5lite.train.trainer.make_train_step: forward + backward + optimizer) on
   batches from that pipeline: tokens per second it consumes.
The ratio (1 / 2) says how far the pipeline is ahead of training (goal >= 5x). The two are
measured one after the other, each with the whole machine; in training they share it.  glibc's
MALLOC_* environment variables (e.g. MALLOC_ARENA_MAX=1) change its allocator from the shell.
Needs the prepared data (`t5lite data prepare corpus vocab_sp8k`).

    python bench/data_pipeline.py --feed [--rows 3000] [--plan compile.json ...]

--feed: the input pipeline against what one TPU host must be fed (issue 36). Packed rows per
host CPU-second of T5 v1.1's input (corpus_span_corruption_t5: the T5 32k SentencePiece,
inputs 512 / targets 114) (a) tokenized and span-corrupted on the fly and (b) read from the
seqio cache (`t5lite data cache`, tokenized once; span corruption and packing still run per
read), counted as CPU seconds of the whole process (every tf.data thread), so the rate is per
core. Beside them each T5 v1.1 row of bench/tpu_plan.jsonl (and --plan files: `t5lite compile
--json` output): the rows and tokens per second one host must supply at the compiled step's
roofline time (a lower bound on the step, so an upper bound on the feed) and the host cores
that takes, against a quarter of the host's vCPUs. Needs `t5lite data prepare corpus
vocab_t5`.
"""

import argparse
import json
import os
import resource
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402


def count_tokens(batch) -> int:
    return int(sum(np.count_nonzero(batch[k]) for k in
                   ("encoder_input_tokens", "decoder_target_tokens") if k in batch))


def bench_pipeline(cfg, num_batches: int):
    from t5lite.tasks import pipeline
    ds = pipeline.get_dataset(cfg.data.mixture_or_task, dict(cfg.data.feature_lengths),
                              cfg.model.architecture, cfg.data.batch_size, split="train",
                              shuffle=True, seed=0, pack=cfg.data.pack)
    it = ds.as_numpy_iterator()
    t0 = time.perf_counter()
    warm = [next(it) for _ in range(5)]  # fills the shuffle buffer, traces the graph
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    tokens = 0
    for _ in range(num_batches):
        tokens += count_tokens(next(it))
    secs = time.perf_counter() - t0
    return warm, {"tokens_per_s": tokens / secs, "batches_per_s": num_batches / secs,
                  "tokens_per_batch": tokens / num_batches, "startup_s": first}


def bench_train_step(cfg, batches, num_steps: int):
    from t5lite import peft
    from t5lite.mesh import partitioning
    from t5lite.train import optim, trainer
    mesh = partitioning.make_mesh(cfg.mesh)
    model = peft.build_model(cfg.model)
    tx = optim.make_optimizer(cfg.optim, cfg.train.steps)
    state, shardings = trainer.create_train_state(cfg, model, mesh, tx)
    step = trainer.make_train_step(cfg, model, tx, mesh, shardings)
    for b in batches[:2]:  # compile
        state, metrics = step(state, b)
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    tokens = 0
    for i in range(num_steps):
        b = batches[i % len(batches)]
        state, metrics = step(state, b)
        tokens += count_tokens(b)
    jax.block_until_ready(metrics)
    secs = time.perf_counter() - t0
    return {"tokens_per_s": tokens / secs, "step_s": secs / num_steps}


# Google's TPU VM host per chip generation: (chips per host VM, vCPUs per host VM).
# v5e: ct5lp-hightpu-8t, 8 chips, 224 vCPUs (cloud.google.com/tpu/docs/v5e, "VM types");
# v5p: 4 chips, 208 vCPUs (cloud.google.com/tpu/docs/v5p, "Number of vCPUs (4-chip VM)").
TPU_HOSTS = {"v5e": (8, 224), "v5p": (4, 208)}
FEED_TASK, FEED_LENGTHS = "corpus_span_corruption_t5", {"inputs": 512, "targets": 114}


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return r.ru_utime + r.ru_stime


def bench_feed(num_rows: int, use_cached: bool, cache_dir: str = "", batch: int = 32):
    """Packed 512/114 rows of FEED_TASK per CPU-second (after 3 warm-up batches)."""
    from t5lite.tasks import pipeline
    ds = pipeline.get_dataset(FEED_TASK, FEED_LENGTHS, "encoder_decoder", batch,
                              split="train", shuffle=True, seed=0, pack=True,
                              use_cached=use_cached, cache_dir=cache_dir)
    it = ds.as_numpy_iterator()
    for _ in range(3):
        next(it)
    c0, t0, rows, tokens = cpu_seconds(), time.perf_counter(), 0, 0
    while rows < num_rows:
        b = next(it)
        rows += len(b["encoder_input_tokens"])
        tokens += count_tokens(b)
    cpu, wall = cpu_seconds() - c0, time.perf_counter() - t0
    return {"rows_per_cpu_s": rows / cpu, "tokens_per_cpu_s": tokens / cpu,
            "rows_per_s": rows / wall, "cpu_s": cpu, "wall_s": wall, "rows": rows,
            "tokens_per_row": tokens / rows}


def plan_rows(paths):
    """T5 v1.1 rows of the TPU plan files (the last of each config/topology/settings)."""
    rows = {}
    for path in paths:
        with open(path) as f:
            text = f.read()
        try:
            reports = [json.loads(text)]  # one `t5lite compile --json` report
        except json.JSONDecodeError:
            reports = [json.loads(line) for line in text.splitlines() if line.strip()]
        for r in reports:
            if r.get("config", "").startswith("t5_1_1") and r.get("fits"):
                rows[(r["config"], r["topology"], tuple(r.get("set") or ()))] = r
    return list(rows.values())


def feed_needs(row, rows_per_core_s: float) -> dict:
    """What one host of row's slice must be fed at its roofline step time, and the cores."""
    per_host, vcpus = TPU_HOSTS[row["chip"]]
    hosts = max(1, row["chips"] // per_host)
    # the roofline step (a lower bound, so the most the host can be asked for); rows written
    # before `t5lite compile` split bound and expected step call it est_step_seconds
    step_s = row.get("roofline_step_seconds") or row["est_step_seconds"]
    rows_per_s = row["batch_size"] / step_s / hosts
    return {"hosts": hosts, "step_s": step_s, "rows_per_s": rows_per_s,
            "tokens_per_s": row["tokens_per_step"] / step_s / hosts,
            "cores": rows_per_s / rows_per_core_s, "quarter": vcpus / 4, "vcpus": vcpus}


def main_feed(args):
    from t5lite.tasks import cache
    print(f"{FEED_TASK} {FEED_LENGTHS}, packed; {os.cpu_count()} CPU cores, load average "
          f"{os.getloadavg()[0]:.1f}")
    fly = bench_feed(args.rows, use_cached=False)
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="t5lite_feed_cache_")
    c0 = cpu_seconds()
    cache.cache_task(FEED_TASK, splits=["train"], cache_dir=cache_dir)
    cache_cpu_s = cpu_seconds() - c0
    cached = bench_feed(args.rows, use_cached=True, cache_dir=cache_dir)
    for name, r in (("(a) on the fly", fly), ("(b) from the cache", cached)):
        print(f"{name:20s} {r['rows_per_cpu_s']:7.1f} rows/CPU-s  {r['tokens_per_cpu_s']:9.0f} "
              f"tokens/CPU-s  ({r['rows']} rows, {r['tokens_per_row']:.0f} non-pad tokens/row,"
              f" {r['cpu_s']:.1f} CPU-s, {r['wall_s']:.1f} s wall)")
    print(f"caching the train split (t5lite's local writer, or nothing if cached): "
          f"{cache_cpu_s:.1f} CPU-s")
    for row in plan_rows(["bench/tpu_plan.jsonl"] + list(args.plan)):
        if row["chip"] not in TPU_HOSTS:
            continue
        print(f"{row['config']} on {row['topology']} (batch {row['batch_size']}"
              + "".join(f", {s}" for s in row.get("set") or ()) + "):")
        for name, r in (("on the fly", fly), ("cached", cached)):
            n = feed_needs(row, r["rows_per_cpu_s"])
            print(f"  {name:10s} step {n['step_s'] * 1e3:6.1f} ms, {n['hosts']} hosts: "
                  f"{n['rows_per_s']:7.1f} rows/s = {n['tokens_per_s']:9.0f} tokens/s per "
                  f"host -> {n['cores']:5.1f} cores of {n['vcpus']} (quarter: "
                  f"{n['quarter']:.0f})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="quickstart")
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--feed", action="store_true", help="the TPU host feed study (issue 36)")
    p.add_argument("--rows", type=int, default=3000, help="--feed: packed rows per measure")
    p.add_argument("--cache-dir", default="", help="--feed: the cache (default: a temp dir)")
    p.add_argument("--plan", nargs="*", default=(), help="--feed: more compile JSON files")
    args = p.parse_args(argv)
    if args.feed:
        return main_feed(args)
    from t5lite.config import load_config
    cfg = load_config(args.config)
    print(f"config {args.config}: {cfg.data.mixture_or_task}, lengths "
          f"{dict(cfg.data.feature_lengths)}, batch {cfg.data.batch_size}, pack "
          f"{cfg.data.pack}; {jax.device_count()} {jax.devices()[0].platform} device(s), "
          f"{os.cpu_count()} CPU cores")
    warm, data = bench_pipeline(cfg, args.batches)
    print(f"pipeline:   {data['tokens_per_s']:10.0f} tokens/s  ({data['batches_per_s']:.1f} "
          f"batches/s, {data['tokens_per_batch']:.0f} non-pad tokens/batch, first 5 batches "
          f"{data['startup_s']:.1f}s)")
    train = bench_train_step(cfg, warm, args.steps)
    print(f"train step: {train['tokens_per_s']:10.0f} tokens/s  ({train['step_s'] * 1e3:.0f} "
          "ms/step)")
    print(f"ratio pipeline / train step: {data['tokens_per_s'] / train['tokens_per_s']:.1f}x "
          "(goal >= 5x)")


if __name__ == "__main__":
    main()
