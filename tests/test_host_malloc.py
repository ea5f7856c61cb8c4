"""t5lite.host_malloc: with glibc tuned, XLA:CPU's per-step buffers are reused instead of being
page-faulted in again every step; the auto mode leaves accelerator hosts alone."""

import json
import subprocess
import sys

import pytest

from t5lite import host_malloc

# a jitted gradient whose temporaries are > 64 MB (one XLA temp block per call)
PROBE = r"""
import json, os, resource, sys
sys.path.insert(0, os.getcwd())
from t5lite import host_malloc
tuned = host_malloc.tune_malloc()
import jax, jax.numpy as jnp
loss = lambda w, x: jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w.T))
f = jax.jit(jax.grad(loss))  # keeps [8192, 2048] activations (64 MB) for the backward pass
w, x = jnp.full((1024, 2048), 0.01, jnp.float32), jnp.ones((8192, 1024), jnp.float32)
for _ in range(3):
    f(w, x).block_until_ready()
windows = []  # faults per call, in 4 windows of 3 calls (the fewest: steady state)
for _ in range(4):
    r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        f(w, x).block_until_ready()
    windows.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) / 3)
print(json.dumps({"tuned": tuned, "faults": min(windows)}))
"""


def run_probe(mode: str, **extra_env) -> dict:
    env = {"T5LITE_TUNE_MALLOC": mode, "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1", **extra_env}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         env=env, check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_tuned_malloc_reuses_xla_buffers_instead_of_page_faulting():
    off, on = run_probe("0"), run_probe("1")
    assert off["tuned"] is False and on["tuned"] is True
    # untuned: the temporaries come back as fresh pages every call
    assert off["faults"] > 10_000, off
    assert on["faults"] < off["faults"] / 4, (on, off)
    # a threshold below the block's size: glibc maps and unmaps it every call, as untuned
    small = run_probe("1", T5LITE_MALLOC_THRESHOLD_MIB="8")
    assert small["tuned"] is True and small["faults"] > off["faults"] / 2, (small, off)


@pytest.mark.parametrize("bad", ["0", "4096", "lots"])
def test_bad_threshold_is_a_user_error(monkeypatch, bad):
    from t5lite.errors import UserError
    monkeypatch.setenv("T5LITE_MALLOC_THRESHOLD_MIB", bad)
    with pytest.raises(UserError, match="whole number of MiB from 1 to 2047"):
        host_malloc.threshold_bytes()
    monkeypatch.delenv("T5LITE_MALLOC_THRESHOLD_MIB")
    assert host_malloc.threshold_bytes() == 512 * 2 ** 20


def test_off_by_default_and_auto_mode_tunes_cpu_hosts_only(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert not host_malloc.cpu_only_host()
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert host_malloc.cpu_only_host()
    monkeypatch.delenv("JAX_PLATFORMS")
    monkeypatch.setattr(host_malloc, "ACCELERATOR_NODES", ("/dev/null",))  # a node that exists
    assert not host_malloc.cpu_only_host()
    monkeypatch.setenv("T5LITE_TUNE_MALLOC", "auto")
    assert host_malloc.tune_malloc() is False
    monkeypatch.setenv("T5LITE_TUNE_MALLOC", "0")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert host_malloc.tune_malloc() is False
    monkeypatch.delenv("T5LITE_TUNE_MALLOC")  # the default: off (opt-in, see the module doc)
    assert host_malloc.tune_malloc() is False
