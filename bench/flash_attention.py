"""Flash attention vs XLA attention for T5 v1.1 on long inputs, compiled for TPU slices on this
CPU host (issue 37): per-chip peak memory and the roofline step time against input length.

For each slice, input length L and model.attention_kernel (xla | flash) the real train step
of configs/<preset>.py is compiled (`t5lite compile`'s path, tpu.compile.compile_step) with
L-token inputs, span-corruption targets (114 per 512 inputs, as T5's pretraining), the same
tokens per step at every length (batch = TOKENS / L, or --batch) and dropout off (the kernel has no
attention dropout; T5 v1.1 pretrains without). The kernel's FLOPs and HBM bytes are its
analytic cost estimate (XLA's cost analysis cannot see inside a Pallas kernel); see
tpu/hlo_cost.py. One JSON line per compile is appended to --out as it finishes.

    nice -n 5 python bench/flash_attention.py --topologies v5p-8 v5e-8 \\
        --lengths 512 2048 4096 8192 16384
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

TOKENS_PER_STEP = 131072  # inputs per step: batch 256 x 512 ... 8 x 16384


def config(preset: str, length: int, kernel: str, remat: str, batch: int | None = None):
    from t5lite import config as config_lib
    targets = max(114 * length // 512, 1)
    batch = batch or TOKENS_PER_STEP // length
    return config_lib.load_config(f"configs/{preset}.py", [
        f"data.feature_lengths={json.dumps({'inputs': length, 'targets': targets})}",
        f"data.batch_size={batch}", f"model.attention_kernel={kernel}",
        "model.dropout_rate=0.0", f"model.remat={remat}"])


def measure(preset: str, topology: str, length: int, kernel: str, remat: str,
            batch: int | None = None) -> dict:
    from t5lite.tpu import compile as tpu_compile
    from t5lite.mesh import topology as topo_lib
    cfg = config(preset, length, kernel, remat, batch)
    topo = topo_lib.parse_topology(topology)
    t0 = time.time()
    r = tpu_compile.compile_step(cfg, topo)
    times = r.get("roofline_seconds") or {}
    return {
        "preset": preset, "topology": topology, "inputs": length,
        "targets": cfg.data.feature_lengths["targets"], "batch": cfg.data.batch_size,
        "attention_kernel": kernel, "remat": remat, "compiled": r["compiled"],
        "fits": r["fits"], "peak_bytes_per_chip": r["bytes_per_chip"]["total"],
        "hbm_bytes_per_chip": r["hbm_bytes_per_chip"],
        "roofline_seconds": times,
        "roofline_step_seconds": r.get("roofline_step_seconds", r.get("est_step_seconds")),
        "flops_per_chip": r.get("flops_per_chip"),
        "bytes_accessed_per_chip": r.get("bytes_accessed_per_chip"),
        "xla_error": r.get("xla_error", "")[:300], "wall_seconds": time.time() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="t5_1_1_base")
    ap.add_argument("--topologies", nargs="+", default=["v5p-8", "v5e-8"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[512, 2048, 4096, 8192, 16384])
    ap.add_argument("--kernels", nargs="+", default=["xla", "flash"])
    ap.add_argument("--batch", type=int, default=None,
                    help="sequences per step at every length (default: 131072 tokens / length); "
                         "a larger batch finds where XLA attention stops fitting a chip")
    ap.add_argument("--remat", default="full")
    ap.add_argument("--out", default="bench/flash_attention.jsonl")
    args = ap.parse_args()
    for topology in args.topologies:
        for length in args.lengths:
            for kernel in args.kernels:
                row = measure(args.preset, topology, length, kernel, args.remat, args.batch)
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                step = row["roofline_step_seconds"]
                print(f"{topology} inputs {length:6d} batch {row['batch']:4d} {kernel:5s} "
                      f"{'fits' if row['fits'] else 'DOES NOT FIT'}: peak "
                      f"{row['peak_bytes_per_chip'] / 2**30:6.2f} GiB/chip, roofline step "
                      f"{(step or 0) * 1e3:8.1f} ms ({row['wall_seconds']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
