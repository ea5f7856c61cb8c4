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
"""

import argparse
import os
import sys
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
    from t5lite.train import optim, partitioning, trainer
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="quickstart")
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args(argv)
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
