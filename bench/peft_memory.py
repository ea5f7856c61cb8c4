"""Compiled train-step memory of PEFT vs full finetuning on this host (XLA memory_analysis).

    python bench/peft_memory.py [--preset t5_1_1_small] [--batch 4] [--lora-rank 8]

Compiles the real train step (trainer.make_train_step, one device) three ways and prints
temp / argument bytes: full finetuning; LoRA with gradients of every param, the optimizer
masking the frozen ones (the form before issue 19: make_train_step(trainable=all True)); LoRA
differentiating the trainable params only (the default). Nothing runs: shapes only. For a TPU
slice use `t5lite compile --config C --topology T --json [--set model.peft.lora_rank=8]`.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax

from t5lite import config as config_lib
from t5lite import peft
from t5lite.tpu import compile as tpu_compile
from t5lite.train import optim
from t5lite.mesh import partitioning


def step_memory(cfg, all_grads: bool = False):
    """(temp, argument) bytes of cfg's compiled train step on one device."""
    mesh = partitioning.make_mesh(cfg.mesh, jax.devices()[:1])
    _, traced = tpu_compile.trace_train_step(cfg, mesh, peft.build_model(cfg.model),
                                              optim.optimizer_for(cfg, cfg.train.steps),
                                              differentiate_all=all_grads)
    with partitioning.activate(mesh):
        m = traced.lower().compile().memory_analysis()
    return m.temp_size_in_bytes, m.argument_size_in_bytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="t5_1_1_small")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--lora-rank", type=int, default=8)
    args = ap.parse_args()
    cfg = config_lib.load_config(f"configs/{args.preset}.py", [
        f"data.batch_size={args.batch}", "mesh.data=1", "mesh.fsdp=1", "mesh.tensor=1"])
    lora = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, peft=dataclasses.replace(cfg.model.peft, lora_rank=args.lora_rank)))
    print(f"{args.preset}, batch {args.batch} x {dict(cfg.data.feature_lengths)}, "
          f"{jax.default_backend()}; MiB per device")
    for name, c, all_grads in (("full finetuning", cfg, False),
                               (f"LoRA r={args.lora_rank}, all gradients", lora, True),
                               (f"LoRA r={args.lora_rank}, trainable gradients", lora, False)):
        temp, arg = step_memory(c, all_grads)
        print(f"  {name:34s} temp {temp / 2**20:9.1f}  arguments {arg / 2**20:9.1f}", flush=True)


if __name__ == "__main__":
    main()
