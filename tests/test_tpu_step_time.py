"""The expected step time (t5lite/tpu/step_time.py): the scheduled HLO replayed on the slice's
torus, on small hand-written modules whose answer is worked out by hand, and on a real program
compiled for v5p:2x2x2."""

import math

import pytest

from t5lite.tpu import hlo_cost, report, step_time
from t5lite.mesh.topology import CHIPS

V5P, V5E = CHIPS["v5p"], CHIPS["v5e"]
MB4 = 1024 * 1024 * 4  # an f32[1024,1024]


def module(*body: str, extra: str = "") -> str:
    lines = "\n".join(f"  {b}" for b in body)
    return (f"HloModule m, is_scheduled=true\n\n{extra}"
            f"ENTRY %main (p: f32[1024,1024]) -> f32[1024,1024] {{\n"
            f"  %p = f32[1024,1024]{{1,0}} parameter(0)\n{lines}\n}}\n")


ADD = "%{0} = f32[1024,1024]{{1,0}} add(%{1}, %{1})"  # 3 x 4 MiB of HBM traffic
GATHER = ("%ag = f32[8192,1024]{1,0} all-gather(%p), channel_id=1, replica_groups=[1,8]<=[8], "
          "dimensions={0}")


def add_seconds(chip=V5P) -> float:
    return 3 * MB4 / chip.hbm_bw


def gather_seconds(chip=V5P, shape=(2, 2, 2)) -> float:
    torus = step_time.Torus.of(chip, shape)
    lanes = sum(2 if w else 1 for w in torus.wraps)
    return 8 * MB4 * 7 / 8 / (lanes * torus.link_bw) + 3 * step_time.HOP_SECONDS


def test_torus_links_and_wraparound_follow_the_slice():
    assert step_time.Torus.of(V5P, (4, 4, 4)).wraps == (True, True, True)
    assert step_time.Torus.of(V5P, (4, 4, 8)).wraps == (True, True, True)
    assert step_time.Torus.of(V5P, (2, 2, 2)).wraps == (False, False, False)
    assert step_time.Torus.of(V5P, (2, 4, 4)).wraps == (False, False, False)
    assert step_time.Torus.of(V5E, (16, 16)).wraps == (False, False)
    # 6 ports of 100 GB/s each way on v5p (1200 GB/s bidirectional), 4 of 50 GB/s on v5e
    assert step_time.Torus.of(V5P, (4, 4, 4)).link_bw == pytest.approx(100e9)
    assert step_time.Torus.of(V5E, (4, 4)).link_bw == pytest.approx(50e9)


@pytest.mark.parametrize("text, group", [
    ("replica_groups={{0,2,4,6},{1,3,5,7}}", [0, 2, 4, 6]),
    ("replica_groups=[2,4]<=[8]", [0, 1, 2, 3]),
    ("replica_groups=[2,4]<=[4,2]T(1,0)", [0, 2, 4, 6]),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", [0, 1, 2, 3]),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}", [0, 4]),
    ("replica_groups={}", list(range(8)))])
def test_replica_groups_in_every_form(text, group):
    assert step_time.replica_group(f"all-gather(%x), {text}, dimensions={{0}}", 8) == group


def test_a_ring_along_one_wrapped_dimension_uses_both_directions():
    torus = step_time.Torus.of(V5P, (4, 4, 4))
    coords = step_time.grid_coords((4, 4, 4))
    along_x, dims = step_time.collective_seconds("all-gather", 4e6, [0, 1, 2, 3], coords, torus)
    assert dims == (0,)
    assert along_x == pytest.approx(3e6 / (2 * 100e9) + 3 * step_time.HOP_SECONDS)
    # the same bytes over two dimensions (16 chips) have twice the links
    xy, dims = step_time.collective_seconds("all-gather", 4e6, list(range(16)), coords, torus)
    assert dims == (0, 1)
    assert xy == pytest.approx(4e6 * 15 / 16 / (4 * 100e9) + 6 * step_time.HOP_SECONDS)
    # on a 2x2x2 mesh (no wraparound) one direction per dimension
    small = step_time.Torus.of(V5P, (2, 2, 2))
    pair, _ = step_time.collective_seconds("all-gather", 4e6, [0, 1],
                                           step_time.grid_coords((2, 2, 2)), small)
    assert pair == pytest.approx(2e6 / 100e9 + step_time.HOP_SECONDS)


def test_a_blocking_collective_adds_its_whole_time():
    text = module(ADD.format("a", "p"), GATHER, "ROOT " + ADD.format("b", "a"))
    r = step_time.expected_step(text, V5P, (2, 2, 2))
    assert r["compute_seconds"] == pytest.approx(2 * add_seconds())
    assert r["seconds"] == pytest.approx(2 * add_seconds() + gather_seconds())
    assert r["exposed_seconds"] == pytest.approx(gather_seconds())
    assert (r["sync_collectives"], r["async_collectives"]) == (1, 0)


@pytest.mark.parametrize("adds", [1, 40])
def test_an_async_pair_hides_behind_the_compute_scheduled_between(adds):
    between = [ADD.format(f"a{i}", "p") for i in range(adds)]
    text = module("%ags = (f32[1024,1024]{1,0}, f32[8192,1024]{1,0}) all-gather-start(%p), "
                  "channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}", *between,
                  "%agd = f32[8192,1024]{1,0} all-gather-done(%ags)",
                  "ROOT " + ADD.format("b", "a0"))
    r = step_time.expected_step(text, V5P, (2, 2, 2))
    work = (adds + 1) * add_seconds()
    assert r["compute_seconds"] == pytest.approx(work)
    # the done waits for what the compute between did not cover
    wait = max(gather_seconds() - adds * add_seconds(), 0.0)
    assert r["seconds"] == pytest.approx(work + wait)
    assert (wait > 0) == (adds == 1)
    assert r["async_collectives"] == 1


GATHER7 = "all-gather({}), channel_id=7, replica_groups=[1,8]<=[8], dimensions={{0}}"
FUSIONS = """%start_comp (s0: f32[1024,1024]) -> (f32[1024,1024], f32[8192,1024]) {
  %s0 = f32[1024,1024]{1,0} parameter(0)
  %g1 = f32[8192,1024]{1,0} """ + GATHER7.format("%s0") + """
  ROOT %t = (f32[1024,1024]{1,0}, f32[8192,1024]{1,0}) tuple(%s0, %g1)
}

%carry_comp (c0: f32[1024,1024]) -> f32[1024,1024] {
  %c0 = f32[1024,1024]{1,0} parameter(0)
  %g2 = f32[8192,1024]{1,0} """ + GATHER7.format("%c0") + """
  ROOT %m = f32[1024,1024]{1,0} add(%c0, %c0)
}

%done_comp (d0: f32[1024,1024]) -> f32[8192,1024] {
  %d0 = f32[1024,1024]{1,0} parameter(0)
  ROOT %g3 = f32[8192,1024]{1,0} """ + GATHER7.format("%d0") + """
}

"""


def test_an_async_collective_fusion_is_one_collective_run_beside_its_carrying_fusions():
    text = module("%st = (f32[1024,1024]{1,0}, f32[8192,1024]{1,0}) fusion(%p), kind=kCustom, "
                  "calls=%start_comp",
                  "%c = f32[1024,1024]{1,0} fusion(%p), kind=kOutput, calls=%carry_comp",
                  "%dn = f32[8192,1024]{1,0} fusion(%c), kind=kCustom, calls=%done_comp",
                  "ROOT " + ADD.format("b", "c"), extra=FUSIONS)
    costs = hlo_cost.hlo_costs(text, V5P)
    assert costs["collectives"] == {"all-gather": {"count": 1, "bytes": 8 * MB4}}
    r = step_time.expected_step(text, V5P, (2, 2, 2))
    assert r["async_collectives"] == 1 and r["sync_collectives"] == 0
    assert r["collective_seconds"] == pytest.approx(gather_seconds())
    assert r["seconds"] > r["compute_seconds"]  # the one carrying add hides a little of it
    assert r["exposed_seconds"] < gather_seconds()


FOUR = "(f32[1024,1024]{1,0}, f32[8192,1024]{1,0}, f32[8192,1024]{1,0}, f32[1024,1024]{1,0})"
PASS_THROUGH = """%carry_tuple (c0: f32[1024,1024], c1: f32[8192,1024], x: f32[1024,1024]) -> """ + FOUR + """ {
  %c0 = f32[1024,1024]{1,0} parameter(0)
  %c1 = f32[8192,1024]{1,0} parameter(1)
  %x = f32[1024,1024]{1,0} parameter(2)
  %g = f32[8192,1024]{1,0} """ + GATHER7.format("%c0") + """
  %a = f32[1024,1024]{1,0} add(%x, %x)
  ROOT %t = """ + FOUR + """ tuple(%c0, %c1, %g, %a)
}

"""


def test_a_fusion_carrying_a_collective_costs_only_its_own_compute():
    """libtpu's async collective fusions hand the collective's shard, destination buffer and
    result through every fusion that carries it (a root tuple): those are the collective's
    DMAs, not the fusion's HBM traffic. The fusion reads x and writes its add; the gather's
    HBM bytes (its shard and result) count once, as a blocking gather's would."""
    text = ("HloModule m, is_scheduled=true\n\n" + PASS_THROUGH
            + "ENTRY %main (p: f32[1024,1024], buf: f32[8192,1024]) -> f32[1024,1024] {\n"
            "  %p = f32[1024,1024]{1,0} parameter(0)\n"
            "  %buf = f32[8192,1024]{1,0} parameter(1)\n"
            f"  %ct = {FOUR} fusion(%p, %buf, %p), kind=kOutput, calls=%carry_tuple\n"
            "  ROOT %r = f32[1024,1024]{1,0} get-tuple-element(%ct), index=3\n}\n")
    costs = hlo_cost.hlo_costs(text, V5P)
    assert costs["op_seconds"] == pytest.approx(2 * MB4 / V5P.hbm_bw)
    assert costs["bytes"] == 2 * MB4 + 9 * MB4
    assert costs["collectives"] == {"all-gather": {"count": 1, "bytes": 8 * MB4}}


def test_a_loop_body_counts_its_trip_count():
    loop = """%cond (cp: (s32[], f32[1024,1024])) -> pred[] {
  %cp = (s32[], f32[1024,1024]{1,0}) parameter(0)
  %ci = s32[] get-tuple-element(%cp), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%ci, %n), direction=LT
}

%body (bp: (s32[], f32[1024,1024])) -> (s32[], f32[1024,1024]) {
  %bp = (s32[], f32[1024,1024]{1,0}) parameter(0)
  %bi = s32[] get-tuple-element(%bp), index=0
  %bx = f32[1024,1024]{1,0} get-tuple-element(%bp), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%bi, %one)
  %y = f32[1024,1024]{1,0} add(%bx, %bx)
  %ag = f32[8192,1024]{1,0} """ + GATHER7.format("%y") + """
  ROOT %out = (s32[], f32[1024,1024]{1,0}) tuple(%next, %y)
}

"""
    text = module("%zero = s32[] constant(0)",
                  "%init = (s32[], f32[1024,1024]{1,0}) tuple(%zero, %p)",
                  "%w = (s32[], f32[1024,1024]{1,0}) while(%init), condition=%cond, body=%body",
                  "ROOT %r = f32[1024,1024]{1,0} get-tuple-element(%w), index=1", extra=loop)
    r = step_time.expected_step(text, V5P, (2, 2, 2))
    assert r["collective_seconds"] == pytest.approx(5 * gather_seconds(), rel=1e-3)
    assert r["seconds"] == pytest.approx(5 * (gather_seconds() + add_seconds()), rel=1e-3)
    # bytes filed by a category of each top-level instruction (bench/hlo_bytes_diff.py):
    # the loop's count too, and every byte filed once
    costs = hlo_cost.hlo_costs(text, V5P, category=lambda line, kind: kind)
    assert sum(costs["bytes_by"].values()) == costs["bytes"]
    assert costs["bytes_by"]["add"] == 5 * (3 * MB4 + 3 * 4)  # the loop counter adds too
    assert costs["bytes_by"]["all-gather"] == 5 * (MB4 + 8 * MB4)
    assert "bytes_by" not in hlo_cost.hlo_costs(text, V5P)


def test_old_reports_keep_their_step_figures():
    assert report.step_figures({"est_step_seconds": 0.5, "est_mfu": 0.4}) == (0.5, 0.4)
    new = {"expected_step_seconds": 0.7, "expected_mfu": 0.3, "roofline_step_seconds": 0.5,
           "roofline_mfu": 0.4}
    assert report.step_figures(new) == (0.7, 0.3)
    assert report.step_figures({"expected_step_seconds": None}) == (None, None)


@pytest.mark.slow  # the default run's guards: test_compile.py's test_t5_fsdp_on_v5e (every
# assertion here, on a real report) and test_xla_flags.py's compile of this gpt2_tiny step
def test_a_compiled_step_is_expected_no_faster_than_its_bound():
    """gpt2_tiny for v5p:2x2x2 (fsdp=8): t5lite's default XLA options leave the fsdp
    collectives blocking, so the expected step adds them to the instructions' time."""
    from t5lite import config as config_lib
    from t5lite.mesh import topology
    from t5lite.tpu import compile as tpu_compile
    pytest.importorskip("libtpu")
    cfg = config_lib.load_config("gpt2_tiny", [
        "data.batch_size=8", "data.feature_lengths.targets=128", "model.vocab_size=256",
        "model.scan_unroll=1", "mesh.data=1", "mesh.fsdp=-1"])
    r = tpu_compile.compile_step(cfg, topology.parse_topology("v5p:2x2x2"))
    assert r["expected_step_seconds"] >= r["roofline_step_seconds"] > 0
    assert 0 < r["expected_mfu"] <= r["roofline_mfu"] < 1
    e = r["expected_seconds"]
    assert e["compute"] == pytest.approx(r["roofline_seconds"]["ops"])
    assert r["expected_collectives"]["sync"] > 0 and e["exposed_collectives"] > 0
    assert e["collectives"] > r["roofline_seconds"]["ici"]  # links and hops, not the total
    assert math.isclose(r["expected_tokens_per_s"] * r["expected_step_seconds"],
                        r["tokens_per_step"])
    text = report.format_report(dict(r, fits=True, hbm_bytes_per_chip=1, headroom_bytes=0))
    assert "roofline bound" in text and "expected step" in text and "est." not in text


def _pipelined_loop(before_done: int, between: int, after_start: int) -> str:
    """A 5-trip loop whose all-gather fusion chain wraps around the iterations: its done
    comes first in the body, its start (a tuple) last."""
    adds = lambda tag, n: [ADD.format(f"{tag}{i}", "bx") for i in range(n)]  # noqa: E731
    body = "\n".join(f"  {b}" for b in [
        "%bp = (s32[], f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) parameter(0)",
        "%bi = s32[] get-tuple-element(%bp), index=0",
        "%bx = f32[1024,1024]{1,0} get-tuple-element(%bp), index=1",
        "%carried = f32[1024,1024]{1,0} get-tuple-element(%bp), index=2",
        "%one = s32[] constant(1)", "%next = s32[] add(%bi, %one)", *adds("a", before_done),
        "%dn = f32[8192,1024]{1,0} fusion(%carried), kind=kCustom, calls=%done_comp",
        *adds("b", between),
        "%st = (f32[1024,1024]{1,0}, f32[8192,1024]{1,0}) fusion(%bx), kind=kCustom, "
        "calls=%start_comp",
        "%sx = f32[1024,1024]{1,0} get-tuple-element(%st), index=0", *adds("c", after_start),
        "ROOT %out = (s32[], f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%next, %bx, %sx)"])
    loop = (FUSIONS + "%cond (cp: (s32[], f32[1024,1024], f32[1024,1024])) -> pred[] {\n"
            "  %cp = (s32[], f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) parameter(0)\n"
            "  %ci = s32[] get-tuple-element(%cp), index=0\n  %n = s32[] constant(5)\n"
            "  ROOT %lt = pred[] compare(%ci, %n), direction=LT\n}\n\n"
            "%body (bp: (s32[], f32[1024,1024], f32[1024,1024])) -> (s32[], f32[1024,1024], "
            "f32[1024,1024]) {\n" + body + "\n}\n\n")
    return module("%zero = s32[] constant(0)",
                  "%init = (s32[], f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%zero, %p, %p)",
                  "%w = (s32[], f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) while(%init), "
                  "condition=%cond, body=%body",
                  "ROOT %r = f32[1024,1024]{1,0} get-tuple-element(%w), index=1", extra=loop)


def test_a_collective_pipelined_across_loop_iterations_hides_behind_the_wrapped_compute():
    covered = step_time.expected_step(_pipelined_loop(10, 0, 10), V5P, (2, 2, 2))
    exposed = step_time.expected_step(_pipelined_loop(0, 20, 0), V5P, (2, 2, 2))
    assert covered["compute_seconds"] == pytest.approx(exposed["compute_seconds"])
    assert covered["async_collectives"] == exposed["async_collectives"] == 1
    # 20 adds (91 us) around the wrap cover most of the 96 us gather; between done and start
    # they cover none of it
    assert covered["exposed_seconds"] < 0.2 * exposed["exposed_seconds"]
    assert exposed["exposed_seconds"] == pytest.approx(5 * gather_seconds(), rel=0.2)


@pytest.mark.parametrize("row", ["maxtext_16b_v5e-256", "maxtext_32b_v5p-128"])
def test_a_published_run_is_expected_within_10_mfu_points(row):
    """The compiled programs of two MaxText runs with published MFU (bench/
    calibrate_step_time.py wrote them: the same shapes, slice, batch, remat, mesh and XLA
    flags; the fixture names its source): the expected step lands within 10 points of the
    measured figure, and the roofline bound above it."""
    import gzip
    import json
    import os

    from t5lite.mesh import topology
    here = os.path.join(os.path.dirname(__file__), "step_time_fixtures")
    with open(os.path.join(here, f"{row}.json")) as f:
        meta = json.load(f)
    with gzip.open(os.path.join(here, f"{row}.hlo.gz"), "rt") as f:
        text = f.read()
    topo = topology.parse_topology(meta["topology"])
    chip = topo.chip
    bound = max(hlo_cost.roofline_seconds(hlo_cost.hlo_costs(text, chip), chip).values())
    expected = max(step_time.expected_step(text, chip, topo.shape, meta["coords"])["seconds"],
                   bound)
    mfu = lambda seconds: meta["maxtext_flops_per_chip"] / (seconds * chip.peak_flops)  # noqa
    assert abs(mfu(expected) - meta["measured_mfu"]) < 0.10
    assert mfu(bound) > meta["measured_mfu"]
