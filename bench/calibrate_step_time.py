"""The step-time model of `t5lite compile` checked against published TPU measurements: the same
model shapes, batch, sequence length, chips and XLA flags compiled by t5lite on this host
(libtpu, no TPU) -> measured vs roofline vs expected MFU (bench/RESULTS.md, issue 34).

    python bench/calibrate_step_time.py compile [ROW ...]   # one process per row (its flags)
    python bench/calibrate_step_time.py analyze             # -> bench/calibrate_step_time.jsonl

`compile` keeps each row's compiled HLO (gzip) and device coordinates under
$T5LITE_CALIBRATION_DIR (default /tmp/t5lite_calibration): `analyze` re-reads them, so a change
to the step-time model needs no recompile.

Measured figures. MaxText's tables of dense decoder models, published with the configs that ran
them (AI-Hypercomputer/maxtext commit 632f65147607dff421c108f1592b7eb416ea7d6a, 2024-01-02,
MaxText/configs/v5p/README.md and MaxText/configs/v5e/README.md, "1x" rows = one slice):
the shapes follow that commit's base.yml (emb 2560, 8 heads of 256, MLP 8192 relu, 16 layers,
vocabulary 32768, logits through the embedding) scaled by global_parameter_scale
(pyconfig.get_individual_scales), sequence 2048, per_device_batch_size x chips, the remat
policy, mesh and LIBTPU_INIT_ARGS of each <size>.sh there. MaxText's MFU counts 6 x params x
tokens + causal attention 6 x heads x layers x head_dim x seq^2 x batch (train.py
calculate_training_tflops at that commit); the measured step time is that over the reported
TFLOP/s per chip, and t5lite's expected MFU here uses the same count.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "calibrate_step_time.jsonl")
CACHE = os.environ.get("T5LITE_CALIBRATION_DIR", "/tmp/t5lite_calibration")
MAXTEXT = ("AI-Hypercomputer/maxtext@632f65147607dff421c108f1592b7eb416ea7d6a "
           "MaxText/configs/{}/README.md")
_V5P_FLAGS = ("--xla_tpu_megacore_fusion_allow_ags=false --xla_enable_async_collective_permute=true"
              " --xla_tpu_enable_ag_backward_pipelining=true"
              " --xla_tpu_enable_data_parallel_all_reduce_opt=true"
              " --xla_tpu_data_parallel_opt_different_sized_ops=true"
              " --xla_tpu_enable_async_collective_fusion=true"
              " --xla_tpu_enable_async_collective_fusion_multiple_steps=true"
              " --xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_gather=true")
_V5E_FLAGS = ("--xla_tpu_enable_data_parallel_all_reduce_opt=true"
              " --xla_tpu_data_parallel_opt_different_sized_ops=true"
              " --xla_tpu_enable_async_collective_fusion=true"
              " --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true"
              " --xla_tpu_enable_async_collective_fusion_multiple_steps=true"
              " --xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_gather=true")


def _maxtext_shape(scale: int) -> dict:
    """MaxText's global_parameter_scale on its Jan 2024 base.yml: doublings rotate through
    heads + MLP width, embedding width, layers (pyconfig.get_individual_scales)."""
    base, rem = divmod(scale.bit_length() - 1, 3)
    heads = base + (rem > 0)
    return {"d_model": 2560 << (base + (rem > 1)), "num_heads": 8 << heads, "head_dim": 256,
            "d_ff": 8192 << heads, "layers": 16 << base}


# row -> (source table, published MFU, TFLOP/s per chip, topology, scale, per-device batch,
#         remat, tensor, LIBTPU_INIT_ARGS, per-device batch compiled here)
# The v5p rows compile at half the published per-device batch: t5lite's XLA attention keeps
# [batch, heads, 2048, 2048] logits that MaxText's flash kernel never writes, and with remat
# "minimal" the published batch needs 158 GiB a chip (XLA's refusal). A row XLA refuses at
# its batch here compiles at half of it (the JSONL row says which). MFU compares per token.
ROWS = {
    "maxtext_16b_v5e-256": ("v5e", 0.6110, 120e12, "v5litepod-256", 16, 6, "full", 1,
                            _V5E_FLAGS, 6),
    "maxtext_32b_v5e-256": ("v5e", 0.6686, 132e12, "v5litepod-256", 32, 4, "full", 1,
                            _V5E_FLAGS, 4),
    "maxtext_32b_v5p-128": ("v5p", 0.7147, 328e12, "v5p-128", 32, 8, "minimal", 4, _V5P_FLAGS,
                            4),
    "maxtext_64b_v5p-128": ("v5p", 0.7031, 323e12, "v5p-128", 64, 4, "minimal", 4, _V5P_FLAGS,
                            2),
}
SEQ, VOCAB = 2048, 32768


def overrides(name: str, chips: int, per_device: int) -> list:
    """t5lite's GPT family at the row's shape: RoPE, RMSNorm, ReLU MLP, no biases or dropout,
    logits through the (tied) embedding, layers scanned, (data 1, fsdp rest, tensor) mesh.
    Attention is XLA's (MaxText ran its flash kernel; t5lite's model.attention_kernel=flash
    does not yet trace under the compile's mesh: shard_map's check_vma)."""
    _, _, _, _, scale, _, remat, tensor, _, _ = ROWS[name]
    s = _maxtext_shape(scale)
    return [f"model.d_model={s['d_model']}", f"model.num_heads={s['num_heads']}",
            f"model.head_dim={s['head_dim']}", f"model.d_ff={s['d_ff']}",
            f"model.num_decoder_layers={s['layers']}", f"model.vocab_size={VOCAB}",
            "model.position=rope", "model.norm=rmsnorm", "model.ffn=relu", "model.use_bias=false",
            "model.tie_embeddings=true", "model.dropout_rate=0.0", "model.scan_layers=true",
            f"model.remat={remat}", f"data.feature_lengths.targets={SEQ}",
            f"data.batch_size={per_device * chips}", "mesh.data=1", "mesh.fsdp=-1",
            f"mesh.tensor={tensor}"]


def maxtext_flops_per_chip(name: str, per_device: int) -> float:
    """MaxText's own count (train.py calculate_training_tflops at the cited commit) for
    ``per_device`` sequences a chip."""
    scale = ROWS[name][4]
    s = _maxtext_shape(scale)
    d, h, k, f, n = s["d_model"], s["num_heads"], s["head_dim"], s["d_ff"], s["layers"]
    params = n * (4 * d * h * k + 2 * d * f + 2 * d) + VOCAB * d + d
    weights = 6 * params * SEQ * per_device
    attention = 12 * h * n * k * SEQ ** 2 * per_device / 2
    return weights + attention


def compile_row(name: str) -> None:
    """Compile the row's train step and keep its HLO, device coordinates and report."""
    from t5lite import config as config_lib
    from t5lite.mesh import partitioning, topology
    from t5lite.tpu import compile as tpu_compile, memory
    from t5lite.train import optim
    import jax
    topo = topology.parse_topology(ROWS[name][3])
    per_device = ROWS[name][9]
    while True:  # XLA refuses a program over HBM: halve the batch (said in the row)
        cfg = config_lib.load_config("gpt2_small", overrides(name, topo.chips, per_device))
        mesh, model = tpu_compile._mesh_and_model(cfg, topo)
        tx = optim.optimizer_for(cfg, cfg.train.steps)
        t0 = time.time()
        _, traced = tpu_compile.trace_train_step(cfg, mesh, model, tx)
        try:
            with partitioning.activate(mesh):
                compiled = traced.lower().compile()
            break
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e) or per_device == 1:
                raise
            print(f"{name}: {per_device} sequences a chip exceed HBM; trying "
                  f"{per_device // 2}", flush=True)
            per_device //= 2
    seconds = time.time() - t0
    os.makedirs(CACHE, exist_ok=True)
    with gzip.open(os.path.join(CACHE, f"{name}.hlo.gz"), "wt") as f:
        f.write(compiled.as_text())
    meta = {"row": name, "topology": topo.name, "jax_topology": topo.jax_name,
            "mesh": dict(mesh.shape), "coords": [list(d.coords) for d in mesh.devices.flat],
            "bytes_per_chip": memory.memory_bytes(compiled.memory_analysis()),
            "compile_seconds": round(seconds), "libtpu_init_args": ROWS[name][8],
            "per_device_batch": per_device, "set": overrides(name, topo.chips, per_device)}
    with open(os.path.join(CACHE, f"{name}.json"), "w") as f:
        json.dump(meta, f)
    print(f"{name}: compiled in {seconds:.0f} s, peak "
          f"{meta['bytes_per_chip']['total'] / 2 ** 30:.1f} GiB per chip", flush=True)


def analyze_row(name: str) -> dict:
    """Measured vs roofline vs expected for a compiled row (its cached HLO)."""
    from t5lite.mesh import topology
    from t5lite.tpu import hlo_cost, step_time
    with open(os.path.join(CACHE, f"{name}.json")) as f:
        meta = json.load(f)
    with gzip.open(os.path.join(CACHE, f"{name}.hlo.gz"), "rt") as f:
        text = f.read()
    source, mfu, tflops, topo_name, _, published_batch, remat, _, flags, _ = ROWS[name]
    topo = topology.parse_topology(topo_name)
    chip = topo.chip
    hlo = hlo_cost.hlo_costs(text, chip)
    times = hlo_cost.roofline_seconds(hlo, chip)
    bound = max(times.values())
    exp = step_time.expected_step(text, chip, topo.shape, meta["coords"])
    expected = max(exp["seconds"], bound)
    flops = maxtext_flops_per_chip(name, meta["per_device_batch"])
    return {
        "row": name, "source": MAXTEXT.format(source), "topology": topo_name,
        "jax_topology": topo.jax_name, "mesh": meta["mesh"], "remat": remat,
        "per_device_batch_published": published_batch,
        "per_device_batch_compiled": meta["per_device_batch"], "seq": SEQ,
        "libtpu_init_args": flags, "measured_mfu": mfu, "measured_tflops_per_chip": tflops,
        "measured_step_seconds": maxtext_flops_per_chip(name, published_batch) / tflops,
        "maxtext_flops_per_chip": flops, "compiled_flops_per_chip": hlo["matmul_flops"],
        "roofline_seconds": times, "roofline_step_seconds": bound,
        "roofline_mfu": flops / (bound * chip.peak_flops),
        "expected_step_seconds": expected,
        "expected_seconds": {"compute": exp["compute_seconds"],
                             "collectives": exp["collective_seconds"],
                             "exposed_collectives": exp["exposed_seconds"]},
        "expected_collectives": {"sync": exp["sync_collectives"],
                                 "async": exp["async_collectives"]},
        "expected_mfu": flops / (expected * chip.peak_flops),
        "expected_minus_measured_points": 100 * (flops / (expected * chip.peak_flops) - mfu),
        "peak_gib_per_chip": meta["bytes_per_chip"]["total"] / 2 ** 30,
        "compile_seconds": meta["compile_seconds"]}


def table(rows: list) -> str:
    """The RESULTS.md table of analyzed rows."""
    out = ["| row | slice, mesh | batch/chip (published / here) | remat | measured MFU | "
           "roofline bound MFU | expected MFU | expected - measured | expected: "
           "instructions + exposed collectives (of all) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e = r["expected_seconds"]
        mesh = "x".join(f"{k[0]}{v}" for k, v in r["mesh"].items())
        out.append(
            f"| {r['row']} | {r['topology']}, {mesh} | {r['per_device_batch_published']} / "
            f"{r['per_device_batch_compiled']} | {r['remat']} | {r['measured_mfu']:.1%} | "
            f"{r['roofline_mfu']:.1%} | {r['expected_mfu']:.1%} | "
            f"{r['expected_minus_measured_points']:+.1f} pt | {e['compute']:.2f} s + "
            f"{e['exposed_collectives']:.2f} s ({e['collectives']:.2f} s) |")
    return "\n".join(out)


def analyze(names: list) -> None:
    """Re-analyze the rows whose HLO is cached; rows in the JSONL file with no cache here
    (another machine's compile) are kept as they are."""
    kept = {}
    if os.path.exists(OUT):
        with open(OUT) as f:
            kept = {r["row"]: r for r in map(json.loads, f)}
    for n in names:
        if os.path.exists(os.path.join(CACHE, f"{n}.hlo.gz")):
            kept[n] = analyze_row(n)
    rows = [kept[n] for n in ROWS if n in kept]
    with open(OUT + ".tmp", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    os.replace(OUT + ".tmp", OUT)
    print(table(rows))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=("compile", "analyze", "one"))
    p.add_argument("rows", nargs="*")
    a = p.parse_args(argv)
    rows = a.rows or list(ROWS)
    if a.stage == "one":  # a child process: LIBTPU_INIT_ARGS is set before libtpu loads
        compile_row(rows[0])
        return 0
    if a.stage == "compile":
        for name in rows:
            env = dict(os.environ, LIBTPU_INIT_ARGS=ROWS[name][8])
            subprocess.run([sys.executable, os.path.abspath(__file__), "one", name], env=env,
                           check=True)
        return 0
    analyze(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
