"""An fsdp-sharded attention projection's kernel gradient is reduce-scattered on a TPU slice,
not all-reduced whole and sliced (issue 50): compiled through libtpu for v5p:2x2x1 on this
host. libtpu gave the gradient of the kernel's [D, H, K] view a layout with D (the fsdp dim)
minor and all-reduced it; DenseGeneral's flat kernel now multiplies as stored, [D, H*K]."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from t5lite.mesh import partitioning, topology
from t5lite.models import layers

D, H, K, B, L = 768, 12, 64, 16, 512  # T5 v1.1 base's attention


class _Attention(nn.Module):
    """The query projection and the output projection of one attention layer."""

    @nn.compact
    def __call__(self, x_BLD):
        shared = dict(dtype=jnp.bfloat16, gradient_rules="accelerator")
        q_BLHK = layers.DenseGeneral(features=(H, K), kernel_axes=("embed", "heads", "kv"),
                                     name="query", **shared)(x_BLD)
        return layers.DenseGeneral(features=(D,), n_in=2, kernel_axes=("heads", "kv", "embed"),
                                   name="out", **shared)(jnp.tanh(q_BLHK))


def _gradient_hlo() -> str:
    devices = topology.abstract_devices(topology.parse_topology("v5p:2x2x1"))
    mesh = jax.sharding.Mesh(np.array(devices).reshape(1, 4, 1), partitioning.MESH_AXES,
                             axis_types=(jax.sharding.AxisType.Auto,) * 3)
    model = _Attention()
    x = jax.ShapeDtypeStruct((B, L, D), jnp.float32,
                             sharding=NamedSharding(mesh, P(partitioning.BATCH_AXES)))
    # the stored flat kernels and their shardings by the rules table (embed -> fsdp)
    specs = {"query": P("fsdp", "tensor"), "out": P("tensor", "fsdp")}
    shardings = {"params": {n: {"kernel": NamedSharding(mesh, spec)} for n, spec in specs.items()}}
    params = {"params": {n: {"kernel": jax.ShapeDtypeStruct(
        (D, H * K) if n == "query" else (H * K, D), jnp.float32,
        sharding=shardings["params"][n]["kernel"])} for n in specs}}
    with partitioning.activate(mesh):
        def grads(params, x):
            return jax.grad(lambda p: jnp.sum(model.apply(p, x).astype(jnp.float32) ** 2))(
                params)
        return jax.jit(grads, out_shardings=shardings).lower(params, x).compile().as_text()


def test_attention_kernel_gradients_are_reduce_scattered_not_all_reduced():
    text = _gradient_hlo()
    # libtpu's reduce-scatter here is a fusion calling an "all-reduce-scatter" computation
    # (an all-reduce and a slice inside); outside those, no kernel-sized all-reduce may stay
    outside = [c for c in text.split("\n\n") if not c.startswith("%all-reduce-scatter")]
    kernel = rf"bf16\[({D},{H},{K}|{H},{K},{D}|{D},{H * K}|{H * K},{D})\]"
    whole = [line for c in outside for line in c.splitlines()
             if " all-reduce(" in line and re.search(kernel, line.split(" all-reduce(")[0])]
    assert not whole, whole
    assert len(re.findall(r"calls=%all-reduce-scatter|reduce-scatter\(", text)) >= 2
