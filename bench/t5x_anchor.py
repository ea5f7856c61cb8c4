"""t5x's examples/t5 network and t5lite compiled for the same TPU slice, same way, on this host
(libtpu, no TPU) -> per-chip memory, HBM bytes and roofline MFU of each (bench/RESULTS.md).

    python bench/t5x_anchor.py --t5x /path/to/google-research/t5x [--size xl]
        [--collective-matmul both] [--layers N] [--batch B] [--dump-hlo DIR]

--dump-hlo writes each side's compiled HLO (DIR/<side>_<size>_L<layers>_cm-<mode>.hlo) for
bench/hlo_bytes_diff.py; the t5lite side then compiles through compile.trace_train_step (the
step compile_step compiles) and is reported by the same function as t5x's side.

The setting of ../shared/TPU_ANCHOR.md: T5 v1.1 base, XL or XXL (t5x: t5_1_1/<size>.gin's
T5Config; t5lite: the t5_1_1_<size> preset), batch 128 (base) or 64 (XL, XXL) x (512 inputs +
114 targets) packed, remat none on both sides (t5x's network has none), dropout 0,
parameters float32 and activations bfloat16, layers unrolled, 8-way parameter sharding along
`embed` (t5x: its standard rules with 2-D parameter partitioning, mesh data=8; t5lite: mesh
fsdp=8), both stepped by t5lite's Adafactor (optim.make_optimizer) and its cross-entropy with
z-loss. Both sides compile with the same XLA options: `--collective-matmul off` is t5lite's
default (partitioning.compiler_options), `on` XLA's own default (windowed einsums).

t5x is not on PyPI: give a checkout (only t5x/examples/t5/{network,layers}.py are imported,
which need flax alone).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

TOPOLOGY = "v5p:2x2x2"
INPUTS, TARGETS = 512, 114
GiB = 1024 ** 3
# t5x/examples/t5/t5_1_1/<size>.gin: (emb_dim, num_heads, layers per stack, mlp_dim); head_dim
# 64 throughout. Batches: ../shared/TPU_ANCHOR.md's (XL at 64: t5x's network has no remat).
SIZES = {"base": (768, 12, 12, 2048), "xl": (2048, 32, 24, 5120), "xxl": (4096, 64, 24, 10240)}
BATCHES = {"base": 128, "xl": 64, "xxl": 64}


def load_t5x_network(root: str):
    """t5x.examples.t5.network from a checkout, without importing the t5x package (whose
    __init__ pulls t5x's trainer, checkpoints and seqio)."""
    base = os.path.join(root, "t5x", "examples", "t5")
    if not os.path.exists(os.path.join(base, "network.py")):
        sys.exit(f"{base}/network.py not found: pass --t5x a checkout of google-research/t5x")
    for pkg in ("t5x", "t5x.examples", "t5x.examples.t5"):
        sys.modules.setdefault(pkg, types.ModuleType(pkg))
    mods = {}
    for name in ("layers", "network"):
        spec = importlib.util.spec_from_file_location(f"t5x.examples.t5.{name}",
                                                      os.path.join(base, f"{name}.py"))
        mods[name] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mods[name]
        setattr(sys.modules["t5x.examples.t5"], name, mods[name])
        spec.loader.exec_module(mods[name])
    return mods["network"]


# t5x.partitioning.standard_logical_axis_rules(activation_partitioning_dims=1,
# parameter_partitioning_dims=2) with the mesh t5x builds for model parallelism 1
T5X_RULES = [("batch", "data"), ("vocab", "model"), ("mlp", "model"), ("heads", "model"),
             ("kv", None), ("joined_kv", "model"), ("embed", "data"), ("relpos_buckets", None),
             ("abspos_buckets", None), ("length", None), ("layers", None), ("stack", None),
             ("mlp_activations", None)]


def t5x_step(network, devices, options: dict, size: str, layers: int, batch_size: int):
    """t5x's T5 v1.1 train step of ``size`` with ``layers`` per stack, jitted over a data=8
    mesh -> (jitted, mesh, abstract args)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    import flax
    from flax import linen as nn
    from flax.linen import partitioning as nn_partitioning
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from t5lite import config as config_lib
    from t5lite.train import losses, optim

    emb, heads, _, mlp = SIZES[size]
    t5cfg = network.T5Config(  # t5x/examples/t5/t5_1_1/{base,xl,xxl}.gin
        vocab_size=32128, dtype=jnp.bfloat16, emb_dim=emb, num_heads=heads,
        num_encoder_layers=layers, num_decoder_layers=layers, head_dim=64, mlp_dim=mlp,
        mlp_activations=("gelu", "linear"), dropout_rate=0.0, logits_via_embedding=False)
    model = network.Transformer(t5cfg)
    mesh = Mesh(np.asarray(devices).reshape(len(devices), 1), ("data", "model"))
    cfg = config_lib.load_config(f"t5_1_1_{size}")
    tx = optim.make_optimizer(cfg.optim, cfg.train.steps)

    tokens = {"inputs": jax.ShapeDtypeStruct((batch_size, INPUTS), jnp.int32),
              "targets": jax.ShapeDtypeStruct((batch_size, TARGETS), jnp.int32)}

    def init(rng, inputs, targets):
        return model.init(rng, inputs, targets, targets, enable_dropout=False)

    variables = jax.eval_shape(init, jax.random.key(0), tokens["inputs"], tokens["targets"])
    axes = flax.core.unfreeze(nn_partitioning.get_axis_names(variables["params_axes"]))
    params = flax.core.unfreeze(variables["params"])
    param_sh = nn.logical_to_mesh_sharding(axes, mesh, T5X_RULES)
    opt = jax.eval_shape(tx.init, params)
    # param-shaped optimizer leaves follow their parameter; Adafactor's factored row / column
    # statistics (a few MB in all) are replicated
    rep = NamedSharding(mesh, P())
    opt_sh = optax.tree_map_params(
        tx, lambda leaf, sh, prm: sh if leaf.shape == prm.shape else rep, opt, param_sh, params,
        transform_non_params=lambda _: rep)
    batch_sh = NamedSharding(mesh, P("data"))
    names = ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
             "encoder_segment_ids", "decoder_segment_ids", "encoder_positions",
             "decoder_positions", "decoder_loss_weights")
    shape = {n: (batch_size, INPUTS if n.startswith("encoder") else TARGETS) for n in names}
    batch = {n: jax.ShapeDtypeStruct(shape[n], jnp.int32, sharding=batch_sh) for n in names}

    def loss_fn(p, b):
        logits = model.apply({"params": p}, *(b[n] for n in names[:7]), enable_dropout=False)
        ce, z = losses.cross_entropy_with_logits(logits, b["decoder_target_tokens"],
                                                 z_loss=cfg.train.z_loss)
        w = b["decoder_loss_weights"].astype(jnp.float32)
        return jnp.sum((ce + z) * w) / jnp.maximum(jnp.sum(w), 1.0)

    def step(state, b):
        p, o = state
        with nn_partitioning.axis_rules(T5X_RULES):
            loss, g = jax.value_and_grad(loss_fn)(p, b)
        u, o = tx.update(g, o, p)
        return (optax.apply_updates(p, u), o), loss

    abstract = (jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                             params, param_sh),
                jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                             opt, opt_sh))
    jitted = jax.jit(step, in_shardings=((param_sh, opt_sh), batch_sh),
                     out_shardings=((param_sh, opt_sh), NamedSharding(mesh, P())),
                     donate_argnums=(0,), compiler_options=options)
    return jitted, mesh, (abstract, batch)


def report(compiled, seconds: float, model_flops_per_chip: float) -> dict:
    from t5lite.mesh import topology
    from t5lite.tpu import hlo_cost, memory
    chip = topology.parse_topology(TOPOLOGY).chip
    mem = compiled.memory_analysis()
    hlo = hlo_cost.hlo_costs(compiled.as_text(), chip)
    times = hlo_cost.roofline_seconds(hlo, chip)
    est = max(times.values())
    b = memory.memory_bytes(mem)
    return {"arguments_gib": b["arguments"] / GiB, "temp_gib": b["temp"] / GiB,
            "xla_temp_gib": b["xla_temp"] / GiB, "total_gib": b["total"] / GiB,
            "flops_per_chip": float(hlo["matmul_flops"]), "hbm_bytes_per_chip": hlo["bytes"],
            "roofline_ms": {k: round(v * 1e3, 2) for k, v in times.items()},
            "roofline_mfu": model_flops_per_chip / (est * chip.peak_flops),
            "compile_seconds": round(seconds)}


def t5lite_compiled(cfg, mesh):
    """t5lite's train step for cfg on mesh, compiled as compile.compile_step compiles it ->
    (compiled, seconds)."""
    import dataclasses

    from t5lite import peft
    from t5lite.mesh import partitioning
    from t5lite.tpu import compile as tpu_compile
    from t5lite.train import optim
    model = peft.build_model(dataclasses.replace(cfg.model, gradient_rules="accelerator"))
    t0 = time.time()
    _, traced = tpu_compile.trace_train_step(cfg, mesh, model,
                                             optim.optimizer_for(cfg, cfg.train.steps))
    with partitioning.activate(mesh):
        compiled = traced.lower().compile()
    return compiled, time.time() - t0


def dump(folder: str, side: str, row: dict, compiled) -> None:
    os.makedirs(folder, exist_ok=True)
    name = f"{side}_{row['size']}_L{row['layers']}_cm-{row['collective_matmul']}.hlo"
    with open(os.path.join(folder, name), "w") as f:
        f.write(compiled.as_text())


def model_flops_per_chip(cfg, mesh, batch_size: int) -> float:
    """3 x forward matmul FLOPs of the step (trainer.step_flops, the model both sides run)."""
    from t5lite import peft
    from t5lite.train import trainer
    from t5lite.train.optim import make_optimizer
    model = peft.build_model(cfg.model)
    abstract, _, _ = trainer.abstract_train_state(cfg, model, mesh,
                                                  make_optimizer(cfg.optim, cfg.train.steps))
    return trainer.step_flops(cfg, model, mesh, abstract.params, batch_size) / mesh.size


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--t5x", help="a checkout of google-research/t5x (needed for the t5x side)")
    p.add_argument("--size", choices=tuple(SIZES), default="base")
    p.add_argument("--batch", type=int, default=0, help="default: the size's (BATCHES)")
    p.add_argument("--layers", type=int, default=0,
                   help="layers per stack on both sides (default: the size's; fewer for a "
                        "quick look at what one layer keeps)")
    p.add_argument("--collective-matmul", choices=("off", "on", "both"), default="both")
    p.add_argument("--sides", nargs="*", choices=("t5x", "t5lite"), default=["t5x", "t5lite"])
    p.add_argument("--dump-hlo", default="", help="a folder for each side's compiled HLO text")
    args = p.parse_args()
    if "t5x" in args.sides and not args.t5x:
        p.error("the t5x side needs --t5x (or --sides t5lite)")
    import jax

    from t5lite import config as config_lib
    from t5lite.mesh import topology
    from t5lite.tpu import compile as tpu_compile
    from t5lite.mesh import partitioning
    topology.require_libtpu()
    topo = topology.parse_topology(TOPOLOGY)
    devices = topology.abstract_devices(topo)
    network = load_t5x_network(args.t5x) if "t5x" in args.sides else None
    batch = args.batch or BATCHES[args.size]
    layers = args.layers or SIZES[args.size][2]
    modes = ("off", "on") if args.collective_matmul == "both" else (args.collective_matmul,)
    sets = ["mesh.data=1", "mesh.fsdp=-1", "model.scan_layers=false", "model.remat=none",
            f"data.batch_size={batch}", f"model.num_encoder_layers={layers}",
            f"model.num_decoder_layers={layers}"]  # the setting of the docstring
    for mode in modes:
        cfg = config_lib.load_config(f"t5_1_1_{args.size}",
                                     sets + [f"mesh.collective_matmul={mode == 'on'}"])
        mesh = partitioning.make_mesh(cfg.mesh, devices)
        row = {"size": args.size, "batch": batch, "layers": layers, "collective_matmul": mode}
        if "t5lite" in args.sides and args.dump_hlo:
            compiled, seconds = t5lite_compiled(cfg, mesh)
            dump(args.dump_hlo, "t5lite", row, compiled)
            print(json.dumps(dict(side="t5lite", **row, **report(
                compiled, seconds, model_flops_per_chip(cfg, mesh, batch)))), flush=True)
        elif "t5lite" in args.sides:
            r = tpu_compile.compile_step(cfg, topo, devices)
            b = r["bytes_per_chip"]
            print(json.dumps(dict(
                side="t5lite", **row, arguments_gib=b["arguments"] / GiB,
                temp_gib=b["temp"] / GiB, xla_temp_gib=b["xla_temp"] / GiB,
                total_gib=b["total"] / GiB, flops_per_chip=r["flops_per_chip"],
                hbm_bytes_per_chip=r["bytes_accessed_per_chip"],
                roofline_ms={k: round(v * 1e3, 2) for k, v in r["roofline_seconds"].items()},
                roofline_mfu=r["roofline_mfu"], compile_seconds=round(r["compile_seconds"]))),
                flush=True)
        if network is not None:
            jitted, t5x_mesh, (state, batch_args) = t5x_step(
                network, devices, partitioning.compiler_options(cfg, mesh), args.size, layers,
                batch)
            t0 = time.time()
            with jax.set_mesh(t5x_mesh):
                compiled = jitted.lower(state, batch_args).compile()
            if args.dump_hlo:
                dump(args.dump_hlo, "t5x", row, compiled)
            print(json.dumps(dict(side="t5x", **row, **report(
                compiled, time.time() - t0, model_flops_per_chip(cfg, mesh, batch)))),
                flush=True)


if __name__ == "__main__":
    main()
