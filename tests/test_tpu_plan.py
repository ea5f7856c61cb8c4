"""bench/tpu_plan.py's shortfall line (issue 50 item 1): a preset under 60% expected MFU names
what stops it, from its own report's figures: the instructions' memory traffic when they alone
cannot reach 60%, the collectives the schedule leaves exposed when they can, and both (the
larger cut first) when the instructions fall short and a tenth or more of the step is exposed."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import tpu_plan  # noqa: E402


def report(step_ms, mfu, instructions_ms, exposed_ms, flops_ms):
    return {"row": "p", "config": "p", "topology": "v5p-8", "expected_step_seconds": step_ms / 1e3,
            "expected_mfu": mfu, "roofline_seconds": {"compute": flops_ms / 1e3},
            "expected_seconds": {"compute": instructions_ms / 1e3,
                                 "exposed_collectives": exposed_ms / 1e3}}


def cells(line):
    return [c.strip() for c in line.strip("|").split("|")]


def test_hbm_bound_instructions_are_named_with_their_numbers():
    # 100 ms at 30% MFU: the FLOPs are 30 ms at peak; instructions 95 ms reach 32%; 5 ms exposed
    c = cells(tpu_plan.shortfall(report(100, 0.30, 95, 5, 30)))
    assert c[2:8] == ["30.0%", "100.0", "50.0", "30.0", "95.0", "5.0"]
    assert c[8] == ("HBM: the instructions alone reach 32% (their FLOPs at peak 30.0 ms, their "
                    "memory traffic makes 95.0 ms)")


def test_exposed_collectives_are_named_with_the_budget_left_for_them():
    # 100 ms at 50%: instructions 70 ms reach 71%; 60% needs an 83.3 ms step: 13.3 ms exposed
    c = cells(tpu_plan.shortfall(report(100, 0.50, 70, 30, 50)))
    assert c[8] == "exposed collectives: 30.0 ms beyond the instructions; 60% needs under 13.3 " \
                   "ms exposed"


def test_both_are_named_the_larger_cut_first():
    # 200 ms at 20%: instructions 70 ms reach 57% (60% needs 66.7 ms), 120 ms exposed
    c = cells(tpu_plan.shortfall(report(200, 0.20, 70, 120, 60)))
    assert c[8] == ("exposed collectives: 120.0 ms (60% of the step); HBM: the instructions "
                    "alone reach 57% (their FLOPs at peak 60.0 ms, their memory traffic makes "
                    "70.0 ms)")


def test_rows_at_the_target_or_without_an_expected_step_have_no_line():
    assert tpu_plan.shortfall(report(100, 0.61, 90, 10, 60)) is None
    assert tpu_plan.shortfall({"expected_step_seconds": None}) is None
    # a report compiled under another row's name is labelled with the row it serves
    assert cells(tpu_plan.shortfall(dict(report(100, 0.30, 95, 5, 30), row="other"),
                                    name="t5_1_1_xxl@remat_full"))[0] == "t5_1_1_xxl@remat_full"


def test_a_report_compiled_under_other_options_or_versions_is_stale_and_not_shown(tmp_path):
    """A stored report is a row's figure only while `t5lite compile` would still build that
    program: compiled under other XLA options (partitioning.compiler_options changed) or
    another jax / libtpu, the row says so and names the command that recompiles it."""
    import json

    from t5lite.mesh import partitioning
    from t5lite.tpu import compile as tpu_compile
    with open(os.path.join(ROOT, "bench", "tpu_plan.jsonl")) as f:
        (r,) = [x for x in map(json.loads, f) if x.get("row") == "electra_small"][-1:]
    options = partitioning.tpu_compiler_options(r["chip"], r["collective_matmul"])
    now = dict(r, compiler_options=options, versions=tpu_compile.versions())
    gather = "xla_tpu_enable_windowed_einsum_for_all_gather"
    other = dict(now, compiler_options=dict(options, **{gather: not options[gather]}))
    older = dict(now, versions={"jax": "0.9.1", "libtpu": "0.0.40"})
    assert tpu_plan.stale(now) == "" and tpu_plan.stale(r) == ""  # r: recorded neither
    assert tpu_plan.stale(other) == "other XLA options"
    assert tpu_plan.stale(older) == "jax 0.9.1 + libtpu 0.0.40"

    def row(report):
        jsonl, out = tmp_path / "plan.jsonl", tmp_path / "plan.md"
        jsonl.write_text(json.dumps(report) + "\n")
        tpu_plan.render(str(jsonl), str(out))
        lines = [ln for ln in out.read_text().splitlines()
                 if ln.startswith("| electra_small |")]  # the plan's, then its shortfall's
        return " / ".join(lines)

    assert f"{now['expected_step_seconds'] * 1e3:.0f} ms / " in row(now)
    assert "HBM: the instructions alone reach" in row(now)  # and its shortfall line
    assert row(other) == ("| electra_small | v5p-8 | | | | not measured: compiled with other "
                          "XLA options: recompile (`--rows electra_small`) | | | | | | | |")
    assert "compiled with jax 0.9.1 + libtpu 0.0.40: recompile" in row(older)
    assert "HBM:" not in row(older)  # a stale report names no bound
