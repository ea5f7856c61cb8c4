"""The asynchronous-collective XLA options per TPU generation (t5lite/mesh/xla_flags.py): the
pinned libtpu accepts every one, as compile options and in LIBTPU_INIT_ARGS (where it aborts
on an unknown flag); they reach the real train step, and the expected-step model sees the
collectives they make asynchronous; the TPU launcher's workers get the same table."""

import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from t5lite import config as config_lib
from t5lite.mesh import partitioning, topology, xla_flags
from t5lite.tpu import compile as tpu_compile, step_time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fsdp_grads(topo_name: str, options: dict) -> dict:
    """Gradients of four fsdp-sharded layers compiled for the slice with ``options`` ->
    step_time.expected_step's figures (the weights are all-gathered forward and backward,
    their gradients reduce-scattered)."""
    topo = topology.parse_topology(topo_name)
    devices = topology.abstract_devices(topo)
    mesh = Mesh(np.array(devices), ("fsdp",))
    w_sharding = NamedSharding(mesh, P("fsdp", None))
    ws = [jax.ShapeDtypeStruct((512, 512), jnp.bfloat16, sharding=w_sharding)] * 4
    x = jax.ShapeDtypeStruct((len(devices) * 256, 512), jnp.bfloat16,
                             sharding=NamedSharding(mesh, P("fsdp")))

    def grads(ws, x):
        def loss(ws):
            h = x
            for w in ws:
                h = jnp.tanh(h @ w)
            return jnp.sum(h * h)
        return jax.grad(loss)(ws)

    compiled = jax.jit(grads, out_shardings=[w_sharding] * 4).lower(ws, x).compile(
        compiler_options=options)
    return step_time.expected_step(compiled.as_text(), topo.chip, topo.shape)


@pytest.mark.parametrize("topo_name, generation, fewer_blocking", [
    ("v4-8", "v4", True), ("v5p-8", "v5p", True), ("v6e-4", "v6e", True),
    # v5e's defaults already run this program's gathers asynchronously (2 blocking, 3 async
    # either way, libtpu 0.0.42.1): the flags must compile and change nothing here
    ("v5litepod-4", "v5e", False)])
def test_each_generations_flags_compile_and_make_collectives_asynchronous(
        topo_name, generation, fewer_blocking):
    options = xla_flags.async_collective_options(generation)
    assert options and options == xla_flags.ASYNC_COLLECTIVES[generation]
    default = _fsdp_grads(topo_name, {})
    flagged = _fsdp_grads(topo_name, options)  # libtpu refuses an unknown compile option
    assert flagged["async_collectives"] > 0
    if fewer_blocking:
        assert flagged["sync_collectives"] < default["sync_collectives"]
        assert flagged["async_collectives"] > default["async_collectives"]
    else:
        assert (flagged["sync_collectives"], flagged["async_collectives"]) == (
            default["sync_collectives"], default["async_collectives"])


def test_the_train_step_compiles_with_them_and_its_gathers_run_asynchronously(monkeypatch):
    """gpt2_tiny's real train step, fsdp over v5p:2x2x2: every collective blocking with
    libtpu's defaults, async collective fusions with the table's options."""
    cfg = config_lib.load_config("gpt2_tiny", [
        "data.batch_size=16", "data.feature_lengths.targets=128", "model.vocab_size=256",
        "model.scan_unroll=1", "mesh.data=1", "mesh.fsdp=-1"])
    topo = topology.parse_topology("v5p:2x2x2")
    monkeypatch.setattr(tpu_compile, "_CACHE", {})
    flagged = tpu_compile.compile_step(cfg, topo)
    monkeypatch.setattr(tpu_compile, "_CACHE", {})
    monkeypatch.setitem(xla_flags.ASYNC_COLLECTIVES, "v5p", {})
    default = tpu_compile.compile_step(cfg, topo)
    assert default["expected_collectives"]["async"] == 0
    assert flagged["expected_collectives"]["async"] > 0
    assert (flagged["expected_collectives"]["sync"]
            < default["expected_collectives"]["sync"])
    assert (flagged["expected_seconds"]["exposed_collectives"]
            < default["expected_seconds"]["exposed_collectives"])


def test_compiler_options_hold_the_generations_set_on_tpu_only():
    tiny = config_lib.load_config("gpt2_tiny")
    cpu_mesh = partitioning.make_mesh(tiny.mesh, jax.devices()[:1])
    assert partitioning.compiler_options(tiny, cpu_mesh) == {}
    devices = topology.abstract_devices(topology.parse_topology("v5litepod-4"))
    mesh = partitioning.make_mesh(tiny.mesh, devices)
    on = config_lib.load_config("gpt2_tiny", ["mesh.collective_matmul=true"])
    assert partitioning.compiler_options(on, mesh) == xla_flags.ASYNC_COLLECTIVES["v5e"]
    off = partitioning.compiler_options(tiny, mesh)
    assert off.items() >= xla_flags.ASYNC_COLLECTIVES["v5e"].items()
    assert not off["xla_tpu_enable_windowed_einsum_for_all_gather"]


def test_libtpu_accepts_every_flag_in_libtpu_init_args():
    """What the launcher's workers get: libtpu aborts at load on a flag it does not know."""
    every = {}
    for generation in xla_flags.ASYNC_COLLECTIVES:
        every.update(xla_flags.async_collective_options(generation))
    args = " ".join(f"--{k}={str(v).lower()}" for k, v in every.items())
    for generation in xla_flags.ASYNC_COLLECTIVES:  # every word the launcher may pass
        assert set(xla_flags.libtpu_init_args(generation).split()) <= set(args.split())
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np
        from t5lite.mesh import topology
        devices = topology.abstract_devices(topology.parse_topology("v5p-8"))
        mesh = jax.sharding.Mesh(np.array(devices), ("x",))
        s = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
        x = jax.ShapeDtypeStruct((1024, 256), jnp.float32, sharding=s)
        jax.jit(lambda a: a @ a.T).lower(x).compile()
        print("compiled")
    """)
    env = dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_PLATFORMS="cpu")
    for flags, ok in ((args, True), (args + " --xla_tpu_no_such_flag=true", False)):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(env, LIBTPU_INIT_ARGS=flags), cwd=ROOT, timeout=300)
        assert (r.returncode == 0 and "compiled" in r.stdout) == ok, r.stderr[-2000:]


def _launch_job():
    """launch/tpu/job.py as tests/launch_helpers.py imports it (launch/ is not on sys.path)."""
    if "launch_tpu" not in sys.modules:
        package = os.path.join(ROOT, "launch", "tpu")
        spec = importlib.util.spec_from_file_location(
            "launch_tpu", os.path.join(package, "__init__.py"),
            submodule_search_locations=[package])
        sys.modules["launch_tpu"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["launch_tpu"])
    return importlib.import_module("launch_tpu.job")


@pytest.mark.parametrize("accelerator, generation", [
    ("v4-8", "v4"), ("v5p-32", "v5p"), ("v5litepod-16", "v5e"), ("v6e-8", "v6e"),
    ("v3-8", None)])
def test_launcher_workers_get_the_same_table(accelerator, generation):
    env = _launch_job().worker_env(accelerator)
    if generation is None:
        assert "LIBTPU_INIT_ARGS" not in env
    else:
        assert env["LIBTPU_INIT_ARGS"] == xla_flags.libtpu_init_args(generation)
        assert xla_flags.libtpu_init_args(generation).count("--") == len(
            xla_flags.ASYNC_COLLECTIVES[generation])
