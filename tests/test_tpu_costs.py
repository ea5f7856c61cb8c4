"""The chip table and topology names, what the HLO cost counter reads from a compiled TPU
program (loop trip counts, convolution windows, VMEM, nested slices) and the per-chip total
libtpu checks against HBM: the figures `t5lite compile` reports are built from these."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5lite.cli import main as cli
from t5lite.tpu import hlo_cost, memory
from t5lite.mesh import topology as tpu_topology
from t5lite.mesh.topology import GiB
from t5lite.errors import UserError


# ----------------------------------------------------------------------------- topology


@pytest.mark.parametrize("name, chip, shape", [
    ("v4-8", "v4", (2, 2, 1)), ("v4-16", "v4", (2, 2, 2)), ("v5p-32", "v5p", (2, 2, 4)),
    ("v5p-128", "v5p", (4, 4, 4)), ("v5p-256", "v5p", (4, 4, 8)),
    ("v5litepod-1", "v5e", (1, 1)), ("v5litepod-16", "v5e", (4, 4)),
    ("v6e-8", "v6e", (2, 4)), ("v6e-256", "v6e", (16, 16)), ("v5p:2x2x4", "v5p", (2, 2, 4)),
    ("V5E:2X4", "v5e", (2, 4))])
def test_topology_names(name, chip, shape):
    topo = tpu_topology.parse_topology(name)
    assert (topo.chip.name, topo.shape, topo.chips) == (chip, shape, math.prod(shape))


@pytest.mark.parametrize("name", ["v3-8", "v5p-7", "v5p-2", "v5litepod-12", "v5e:2x2x2",
                                  "tpu", "v6e:0x4"])
def test_unknown_topology_is_one_user_error(name, capsys):
    with pytest.raises(UserError):
        tpu_topology.parse_topology(name)
    rc = cli.main(["compile", "--config", "gpt2_tiny", "--topology", name])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "topology" in err[0]


def test_missing_libtpu_says_what_to_install(monkeypatch, capsys):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "libtpu" else real(n, *a))
    assert cli.main(["compile", "--config", "gpt2_tiny", "--topology", "v5e:2x2"]) == 2
    err = capsys.readouterr().err
    assert "pip install" in err and "jax[tpu]" in err and len(err.strip().splitlines()) == 1


def test_chip_table_has_every_generation():
    for name in ("v4", "v5e", "v5p", "v6e"):
        c = tpu_topology.CHIPS[name]
        assert c.hbm_bytes > 8 * GiB and c.hbm_bw > 5e11 and c.peak_flops > 1e14
        assert c.ici_bw > 1e11


def test_training_mfu_reads_the_chip_table():
    """One chip table: the training logs' peak per device kind is the compile's chip peak;
    the longest device-kind name wins; CPUs have none."""
    for kind, chip in (("TPU v5 lite", "v5e"), ("TPU v5p", "v5p"), ("TPU v4", "v4"),
                       ("TPU v6e", "v6e")):
        assert tpu_topology.peak_flops(kind) == tpu_topology.CHIPS[chip].peak_flops
    assert tpu_topology.peak_flops("NVIDIA A100-SXM4-40GB") == 312e12  # not A10's
    assert tpu_topology.peak_flops("cpu") is None


HLO = """HloModule m

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]) parameter(0)
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %rs = f32[2]{0} reduce-scatter(%x), dimensions={0}
  %ag = f32[8]{0} all-gather(%rs), dimensions={0}
  ROOT %t = (s32[], f32[8]) tuple(%i, %ag)
}

%cond (p: (s32[], f32[8])) -> pred[] {
  %p = (s32[], f32[8]) parameter(0)
  %c = s32[] constant(12)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %ar = f32[8]{0} all-reduce(%a), to_apply=%add
  %w = (s32[], f32[8]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[8]{0} get-tuple-element(%w), index=1
}
"""


def test_collectives_count_loop_bodies_times_their_trip_count():
    assert hlo_cost.hlo_collectives(HLO) == {  # all-reduce = reduce-scatter + all-gather: 2 x 32 B
        "all-reduce": {"count": 1, "bytes": 64}, "reduce-scatter": {"count": 12, "bytes": 384},
        "all-gather": {"count": 12, "bytes": 384}}


# The shape of XLA's TPU collective matmul: a loop over shard pairs whose u32 counter starts
# at 0 and steps by 2 up to 4 (2 trips), holding a batched matmul written as a convolution
# whose batch dimension rides a dilated window (8 x 16 @ 16 x 4, batch 3: 1 of 3 positions
# of the 3-wide window lands on the input per output position).
HLO_LOOP = """HloModule m

%fused (p0: bf16[3,8,16], p1: bf16[3,16,4]) -> bf16[3,8,4] {
  %p0 = bf16[3,8,16]{2,1,0} parameter(0)
  %p1 = bf16[3,16,4]{2,1,0} parameter(1)
  ROOT %conv = bf16[3,8,4]{2,1,0} convolution(%p0, %p1), window={size=3 stride=2 lhs_dilate=3}, dim_labels=0bf_0io->0bf
}

%body (wide.p: (bf16[3,8,16], bf16[3,16,4], u32[])) -> (bf16[3,8,16], bf16[3,16,4], u32[]) {
  %wide.p = (bf16[3,8,16]{2,1,0}, bf16[3,16,4]{2,1,0}, u32[]{:T(128)}) parameter(0)
  %x = bf16[3,8,16]{2,1,0} get-tuple-element(%wide.p), index=0
  %w = bf16[3,16,4]{2,1,0} get-tuple-element(%wide.p), index=1
  %i = u32[]{:T(128)} get-tuple-element(%wide.p), index=2
  %two = u32[]{:T(128)} constant(2)
  %cp = bf16[3,16,4]{2,1,0} collective-permute(%w), source_target_pairs={{0,1},{1,0}}
  %f = bf16[3,8,4]{2,1,0} fusion(%x, %cp), kind=kOutput, calls=%fused
  %next = u32[]{:T(128)} add(%i, %two)
  ROOT %t = (bf16[3,8,16]{2,1,0}, bf16[3,16,4]{2,1,0}, u32[]{:T(128)}) tuple(%x, %cp, %next)
}

%cond (wide.q: (bf16[3,8,16], bf16[3,16,4], u32[])) -> pred[] {
  %wide.q = (bf16[3,8,16]{2,1,0}, bf16[3,16,4]{2,1,0}, u32[]{:T(128)}) parameter(0)
  %n = u32[]{:T(128)} constant(4)
  %j = u32[]{:T(128)} get-tuple-element(%wide.q), index=2
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (a: bf16[3,8,16], b: bf16[3,16,4], c: bf16[8,16], e: bf16[16,4]) -> bf16[3,16,4] {
  %a = bf16[3,8,16]{2,1,0} parameter(0)
  %b = bf16[3,16,4]{2,1,0} parameter(1)
  %c = bf16[8,16]{1,0} parameter(2)
  %e = bf16[16,4]{1,0} parameter(3)
  %zero = u32[]{:T(128)} constant(0)
  %init = (bf16[3,8,16]{2,1,0}, bf16[3,16,4]{2,1,0}, u32[]{:T(128)}) tuple(%a, %b, %zero)
  %loop = (bf16[3,8,16]{2,1,0}, bf16[3,16,4]{2,1,0}, u32[]{:T(128)}) while(%init), condition=%cond, body=%body
  %d = bf16[8,4]{1,0} dot(%c, %e), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %r = bf16[3,16,4]{2,1,0} get-tuple-element(%loop), index=1
}
"""


def test_hlo_costs_follow_the_loop_counter_and_count_valid_window_positions():
    c = hlo_cost.hlo_costs(HLO_LOOP)
    per_trip = 2 * 3 * 8 * 16 * 4  # the batched matmul: batch 3, 8 x 16 @ 16 x 4
    dot = 2 * 8 * 4 * 16  # lhs_contracting_dims={1} of an 8 x 16 lhs
    assert c["matmul_flops_once"] == per_trip + dot
    assert c["matmul_flops"] == 2 * per_trip + dot  # start 0, step 2, bound 4: two trips
    assert c["collectives"] == {"collective-permute": {"count": 2, "bytes": 2 * 3 * 16 * 4 * 2}}
    assert c["bytes"] > c["bytes_once"] > 0


# A prefetch into VMEM (copy-start / copy-done) feeding a matmul fusion, as XLA's TPU
# memory-space assignment writes it: the layout's S(1) places the copy in VMEM.
HLO_VMEM = """HloModule m

%fused (p0: bf16[256,512], p1: bf16[512,128]) -> bf16[256,128] {
  %p0 = bf16[256,512]{1,0:T(8,128)(2,1)} parameter(0)
  %p1 = bf16[512,128]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %d = bf16[256,128]{1,0:T(8,128)(2,1)} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: bf16[256,512], b: bf16[512,128]) -> bf16[256,128] {
  %a = bf16[256,512]{1,0:T(8,128)(2,1)} parameter(0)
  %b = bf16[512,128]{1,0:T(8,128)(2,1)} parameter(1)
  %cs = (bf16[256,512]{1,0:T(8,128)(2,1)S(1)}, bf16[256,512]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%a)
  %cd = bf16[256,512]{1,0:T(8,128)(2,1)S(1)} copy-done(%cs)
  ROOT %f = bf16[256,128]{1,0:T(8,128)(2,1)} fusion(%cd, %b), kind=kOutput, calls=%fused
}
"""


def test_hbm_bytes_skip_vmem_and_each_instruction_gets_its_own_roofline():
    chip = tpu_topology.CHIPS["v5e"]
    c = hlo_cost.hlo_costs(HLO_VMEM, chip)
    a, b, out = 256 * 512 * 2, 512 * 128 * 2, 256 * 128 * 2
    # the prefetch reads a from HBM once; the fusion reads a from VMEM, b from HBM, writes out
    assert c["bytes"] == a + b + out
    flops = 2 * 256 * 512 * 128
    assert c["matmul_flops"] == flops
    # only the fusion runs on the TensorCore: its own max(FLOPs, HBM bytes)
    assert c["op_seconds"] == pytest.approx(max(flops / chip.peak_flops, (b + out) / chip.hbm_bw))
    assert hlo_cost.hlo_costs(HLO_VMEM)["op_seconds"] == 0.0  # no chip, no time


# A scanned layer's backward reading its slice of a stacked [layers, ...] residual through a
# nested fusion: only the [1, 8, 16] slice is read, not the [4, 8, 16] stack.
HLO_NESTED_SLICE = """HloModule m

%inner (q0: f32[4,8,16], q1: s32[]) -> f32[1,8,16] {
  %q0 = f32[4,8,16]{2,1,0} parameter(0)
  %q1 = s32[]{:T(128)S(6)} parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = f32[1,8,16]{2,1,0} dynamic-slice(%q0, %q1, %z, %z), dynamic_slice_sizes={1,8,16}
}

%outer (p0: f32[4,8,16], p1: s32[], p2: f32[1,8,16]) -> f32[1,8,16] {
  %p0 = f32[4,8,16]{2,1,0} parameter(0)
  %p1 = s32[]{:T(128)S(6)} parameter(1)
  %p2 = f32[1,8,16]{2,1,0} parameter(2)
  %n = f32[1,8,16]{2,1,0} fusion(%p0, %p1), kind=kLoop, calls=%inner
  ROOT %m = f32[1,8,16]{2,1,0} multiply(%n, %p2)
}

ENTRY %main (a: f32[4,8,16], i: s32[], b: f32[1,8,16]) -> f32[1,8,16] {
  %a = f32[4,8,16]{2,1,0} parameter(0)
  %i = s32[]{:T(128)S(6)} parameter(1)
  %b = f32[1,8,16]{2,1,0} parameter(2)
  ROOT %f = f32[1,8,16]{2,1,0} fusion(%a, %i, %b), kind=kLoop, calls=%outer
}
"""


def test_hbm_bytes_of_a_stacked_operand_read_through_a_nested_slice_are_the_slice():
    slice_bytes = 8 * 16 * 4
    # the slice of a, all of b, the output; the index lives in SMEM
    assert hlo_cost.hlo_costs(HLO_NESTED_SLICE)["bytes"] == 3 * slice_bytes


def test_hbm_bytes_of_a_compiled_matmul_are_its_inputs_and_output():
    """The whole HBM traffic model against the one program whose traffic is known: a matmul
    with an elementwise epilogue reads each input once and writes its output once."""
    topo = tpu_topology.parse_topology("v5litepod-1")
    mesh = jax.sharding.Mesh(np.array(tpu_topology.abstract_devices(topo)[:1]), ("x",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    x = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16, sharding=rep)
    text = jax.jit(lambda a, b: jnp.tanh(a @ b) * 2).lower(x, x).compile().as_text()
    c = hlo_cost.hlo_costs(text, topo.chip)
    size = 2048 * 2048 * 2
    assert 3 * size <= c["bytes"] <= 3.1 * size
    assert c["matmul_flops"] == 2 * 2048 ** 3
    compute = c["matmul_flops"] / topo.chip.peak_flops
    assert max(compute, c["bytes"] / topo.chip.hbm_bw) <= c["op_seconds"] <= (
        compute + c["bytes"] / topo.chip.hbm_bw)


def _scanned_sgd(layers):
    """A donated stack of `layers` f32 8192^2 weights, a rematerialised scan over them, one
    SGD update, compiled for one v5p chip (tens of GiB: the compiler's HBM check decides)."""
    topo = tpu_topology.parse_topology("v5p:2x2x1")
    mesh = jax.sharding.Mesh(np.array(tpu_topology.abstract_devices(topo)[:1]), ("x",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    n = 8192

    def step(ws, a):
        def loss(ws):
            body = jax.checkpoint(lambda c, w: (jnp.tanh(c @ w), None))
            return jnp.sum(jax.lax.scan(body, a, ws)[0] ** 2)
        return jax.tree.map(lambda w, g: w - 0.1 * g, ws, jax.grad(loss)(ws))

    ws = jax.ShapeDtypeStruct((layers, n, n), jnp.float32, sharding=rep)
    a = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=rep)
    return jax.jit(step, donate_argnums=0).lower(ws, a).compile()


def test_per_chip_total_is_what_the_tpu_compiler_checks_against_hbm():
    """libtpu compiles a program whose peak fits the chip although its arguments +
    temp_size_in_bytes do not, and refuses the next size up: memory_total must be the figure
    it checks (the peak), or `fits` says no to programs that run."""
    mem = _scanned_sgd(126).memory_analysis()
    total = memory.memory_total(mem)
    assert total <= 95.74 * GiB < mem.argument_size_in_bytes + mem.temp_size_in_bytes
    assert memory.memory_bytes(mem)["temp"] == total - mem.argument_size_in_bytes  # all donated
    with pytest.raises(Exception, match="RESOURCE_EXHAUSTED") as e:
        _scanned_sgd(128)
    need = float(re.search(r"temporaries \(([\d.]+)G\)", str(e.value)).group(1)) * GiB
    # two more f32 8192^2 layers: each adds its weight, its gradient and its saved input
    assert abs(need - (total + 2 * 3 * 8192 ** 2 * 4)) < 0.02 * GiB
