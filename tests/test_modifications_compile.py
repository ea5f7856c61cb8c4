"""The modifications table's compiled cost (issue 38 item 3): the TPU-hours estimate read from
compiled stages (bench/modifications_compile.py's JSON lines), its finetuning stages modelled
as the baseline's compiled step scaled by each row's pretraining step ratio, and the table of
compiled Ops and step rates beside the paper's. No compile runs here: the lines stand for
compiles (their stages' real planned configs and overrides, their figures chosen so the
arithmetic is checkable)."""

import functools

import pytest

from t5lite import ablations
from t5lite.ablations import estimation, pretrain_columns
from t5lite.ablations.modifications import TABLE
from t5lite.ablations.plan import default_tasks, row_training_stages
from t5lite.errors import UserError

TOPO = "v4-8"
GiB = 1024 ** 3


@functools.lru_cache(maxsize=None)
def _stages(row: str) -> dict:
    stages = row_training_stages(TABLE, TABLE.row(row), "/estimate",
                                 default_tasks(TABLE, "paper"), "paper")
    return {st.kind if st.kind == "pretrain" else f"finetune_{st.task}": st for st in stages}


def _line(row: str, stage: str, step: float, **kw) -> dict:
    st = _stages(row)[stage]
    return dict({"row": row, "stage": stage, "topology": TOPO, "extra": [],
                 "config": st.config, "overrides": st.overrides, "fits": True, "chips": 4,
                 "peak_gib_per_chip": 10.0, "ops_T": 44.4, "expected_step_seconds": step,
                 "roofline_step_seconds": step * 0.8, "scanned": {"encoder": True,
                                                                  "decoder": True}}, **kw)


def _steps() -> dict:
    """A made-up expected step per vanilla stage: 0.1 s pretraining, 0.5 s XSum (32 x (2048,
    178)), 0.3 s the rest (batch 128 x (512, 512): one compiled step, step_key)."""
    return {name: {"pretrain": 0.1, "finetune_xsum": 0.5}.get(name, 0.3)
            for name in _stages("vanilla")}


def _compiled() -> list:
    """vanilla: pretraining, SuperGLUE and XSum compiled; swiglu: only its pretraining (twice
    as slow)."""
    return ([_line("vanilla", name, _steps()[name])
             for name in ("pretrain", "finetune_super_glue", "finetune_xsum")]
            + [_line("swiglu", "pretrain", 0.2)])


def test_finetuning_stages_alike_share_one_compile():
    keys = {name: estimation.step_key(st.cfg) for name, st in _stages("vanilla").items()}
    assert keys["finetune_web_questions"] == keys["finetune_super_glue"] == keys[
        "finetune_wmt_ende_scratch"]
    assert len({keys["pretrain"], keys["finetune_xsum"], keys["finetune_super_glue"]}) == 3


def test_finetuning_is_the_baselines_step_scaled_by_the_pretraining_ratio(capsys):
    got = ablations.estimate(TABLE, rows=["vanilla", "swiglu"], scale="paper", topology=TOPO,
                             compiled=_compiled(), compile_missing=False)
    stages, steps = _stages("vanilla"), _steps()
    assert stages["pretrain"].cfg.train.steps == 2 ** 19
    vanilla = 4 * sum((st.cfg.train.steps - st.start) * steps[name]
                      for name, st in stages.items()) / 3600
    assert got["rows"]["vanilla"]["tpu_hours"] == pytest.approx(vanilla)
    # swiglu's pretraining step is 2x vanilla's: its finetuning stages are modelled 2x too
    assert got["rows"]["swiglu"]["tpu_hours"] == pytest.approx(2 * vanilla)
    assert got["total"]["tpu_hours"] == pytest.approx(3 * vanilla)
    out = capsys.readouterr().out
    assert f"on {TOPO}" in out and "pretraining step / the baseline's" in out
    # what each compiled stage needs a chip and its step: swiglu's finetuning is not compiled
    assert [f[0] for f in got["rows"]["swiglu"]["fits"]] == ["pretrain"]
    assert "compiled, each fitting (per chip, expected step)" in out
    swiglu, = [x for x in out.splitlines() if x.startswith("swiglu: pretrain ")]
    assert swiglu.endswith("GiB a chip, 200.0 ms"), swiglu


def test_a_row_not_compiled_or_not_fitting_stays_out_of_the_total(capsys):
    lines = _compiled() + [_line("gelu", "pretrain", 0.1, fits=False,
                                 peak_gib_per_chip=40.0)]
    got = ablations.estimate(TABLE, rows=["vanilla", "gelu", "elu"], scale="paper",
                             topology=TOPO, compiled=lines, compile_missing=False)
    assert got["rows"]["gelu"]["tpu_hours"] is None
    assert "does not fit" in got["rows"]["gelu"]["not_estimated"]
    assert "not among the compiled stages" in got["rows"]["elu"]["not_estimated"]
    assert got["total"]["tpu_hours"] == pytest.approx(got["rows"]["vanilla"]["tpu_hours"])
    out = capsys.readouterr().out
    elu = [x for x in out.splitlines() if x.startswith("elu | ")]
    e = got["rows"]["elu"]
    assert elu == [f"elu | {e['steps']:,} | {e['tokens']:.3g} | -"]
    assert "not in the total: gelu:" in out
    # every stage compiled: swiglu's own finetuning is needed, and is not there
    got = ablations.estimate(TABLE, rows=["swiglu"], scale="paper", topology=TOPO,
                             compiled=_compiled(), compile_missing=False,
                             finetuning="compiled")
    assert "swiglu/finetune_" in got["rows"]["swiglu"]["not_estimated"]
    with pytest.raises(UserError, match="scaled"):
        ablations.estimate(TABLE, rows=["swiglu"], topology=TOPO, finetuning="sometimes")


def test_preload_takes_only_this_topologys_plain_lines():
    lines = _compiled()
    lines += [dict(lines[0], topology="v5p-8"), dict(lines[0], extra=["x=1"]),
              dict(lines[0], error="RuntimeError: boom")]
    cache = {}
    assert estimation.preload(cache, lines, TOPO) == len(_compiled())
    st = _stages("vanilla")["pretrain"]
    report = cache[estimation.step_key(st.cfg)]
    assert report["expected_step_seconds"] == 0.1 and report["bytes_per_chip"]["total"] == (
        10 * GiB)


def test_compiled_table_beside_the_papers_columns():
    lines = _compiled() + [
        _line("swiglu", "pretrain", 0.25, ops_T=50.0),  # a later line replaces the first
        _line("fixup", "pretrain", 0.1, extra=["model.scan_layers=False"]),  # not the plan's
        {"row": "gelu", "stage": "pretrain", "topology": TOPO, "extra": [],
         "error": "RuntimeError: boom"}]
    md = pretrain_columns.compiled_table(TABLE, lines, TOPO)
    rows = {r.split(" | ")[0].strip("| "): r for r in md.splitlines()[2:]}
    assert list(rows) == ["Vanilla Transformer", "GeLU", "SwiGLU"]  # the table's order
    assert rows["Vanilla Transformer"] == (
        "| Vanilla Transformer | scan/scan | yes | 10.00 | 44.4 | 7.4 | 11.1 | 10.00 | 12.50 "
        "| 3.50 | 1.00 | 1.00 |")
    assert "| 50.0 | 8.3 | 11.1 | 4.00 | 5.00 | 3.53 | 0.40 | 1.01 |" in rows["SwiGLU"]
    assert "| error |" in rows["GeLU"]


def test_a_stage_that_does_not_fit_is_costed_as_its_fitting_variant(capsys):
    plan = _line("vanilla", "finetune_xsum", 0.5, fits=False, peak_gib_per_chip=33.2,
                 expected_step_seconds=None, roofline_step_seconds=None)
    accum = ["train.grad_accum_steps=2"]
    variant = dict(_line("vanilla", "finetune_xsum", 0.5, peak_gib_per_chip=18.0), extra=accum)
    other = dict(_line("swiglu", "finetune_xsum", 0.9), extra=accum)  # another row's
    lines = [x for x in _compiled() if x["stage"] != "finetune_xsum"] + [plan, other, variant]
    fitted = pretrain_columns.fitted_lines(lines)
    xsum = [x for x in fitted if x["stage"] == "finetune_xsum"]
    assert len(fitted) == len(_compiled()) and len(xsum) == 1
    assert xsum[0]["fitted_with"] == accum and xsum[0]["overrides"] == plan["overrides"]
    assert xsum[0]["expected_step_seconds"] == 0.5 and xsum[0]["extra"] == []
    got = ablations.estimate(TABLE, rows=["vanilla"], scale="paper", topology=TOPO,
                             compiled=fitted, compile_missing=False)
    stages, steps = _stages("vanilla"), _steps()
    assert got["rows"]["vanilla"]["tpu_hours"] == pytest.approx(4 * sum(
        (st.cfg.train.steps - st.start) * steps[name] for name, st in stages.items()) / 3600)
    plain = ablations.estimate(TABLE, rows=["vanilla"], scale="paper", topology=TOPO,
                               compiled=lines, compile_missing=False)
    assert "does not fit" in plain["rows"]["vanilla"]["not_estimated"]
    md = pretrain_columns.compiled_table(TABLE, [dict(variant, stage="pretrain", extra=[],
                                                      fitted_with=accum,
                                                      plan_peak_gib_per_chip=33.2)], TOPO)
    assert "| no (33.20); with train.grad_accum_steps=2 | 18.00 |" in md


def test_a_recompiled_fitting_variant_supersedes_the_older_one():
    """bench/modifications_compile.py --since appends a stage's plan line and its fitting
    variant again: the estimate costs the stage by the newer variant (the older one came
    first in the file and was taken before)."""
    plan = _line("vanilla", "finetune_xsum", 0.5, fits=False, peak_gib_per_chip=33.2,
                 expected_step_seconds=None, roofline_step_seconds=None)
    accum = ["train.grad_accum_steps=2"]
    old = dict(_line("vanilla", "finetune_xsum", 0.6, peak_gib_per_chip=18.0), extra=accum)
    new = dict(_line("vanilla", "finetune_xsum", 0.5, peak_gib_per_chip=18.0), extra=accum)
    rest = [x for x in _compiled() if x["stage"] != "finetune_xsum"]
    fitted = pretrain_columns.fitted_lines(rest + [plan, old, plan, new])
    assert {x["expected_step_seconds"] for x in fitted if x["stage"] == "finetune_xsum"} == {
        0.5}
    got = ablations.estimate(TABLE, rows=["vanilla"], scale="paper", topology=TOPO,
                             compiled=fitted, compile_missing=False)
    stages, steps = _stages("vanilla"), _steps()
    assert got["rows"]["vanilla"]["tpu_hours"] == pytest.approx(4 * sum(
        (st.cfg.train.steps - st.start) * steps[name] for name, st in stages.items()) / 3600)


def test_a_line_compiled_before_its_rows_plan_changed_is_not_the_same_step():
    """bench/modifications_compile.py recompiles and the render leaves out a row whose plan
    changed since its line was written: a model or optimizer change counts, what the compiled
    step does not read (evaluation cadence, steps) does not."""
    cfg = _stages("rezero")["pretrain"].cfg
    line = _line("rezero", "pretrain", 0.1)
    assert estimation.same_step(line, cfg)
    assert estimation.same_step(dict(line, overrides=line["overrides"] + [
        "train.eval_every=5000", "train.steps=1000"]), cfg)
    old = [o for o in line["overrides"] if o != "model.embed_like_classifier=True"]
    assert len(old) == len(line["overrides"]) - 1
    assert not estimation.same_step(dict(line, overrides=old), cfg)
    assert not estimation.same_step({k: v for k, v in line.items() if k != "overrides"}, cfg)


def test_ablate_estimate_reads_compiled_stages_from_a_file(tmp_path, capsys):
    """`t5lite ablate --estimate --topology --compiled FILE`: the file's stages are not
    compiled again (a stage that did not fit as planned is costed as its fitting variant; a
    line cut short by a killed run is skipped); --compiled without --topology is refused."""
    import json

    from t5lite.cli import main as cli
    plan = _line("vanilla", "finetune_xsum", 0.5, fits=False, peak_gib_per_chip=33.2,
                 expected_step_seconds=None, roofline_step_seconds=None)
    variant = dict(_line("vanilla", "finetune_xsum", 0.5, peak_gib_per_chip=18.0),
                   extra=["train.grad_accum_steps=2"])
    lines = [x for x in _compiled() if x["stage"] != "finetune_xsum"] + [plan, variant]
    log = tmp_path / "compiled.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"row": "vani')
    assert cli.main(["ablate", "--table", "modifications", "--estimate", "--topology", TOPO,
                     "--rows", "vanilla", "--compiled", str(log)]) == 0
    stages, steps = _stages("vanilla"), _steps()
    hours = 4 * sum((st.cfg.train.steps - st.start) * steps[name]
                    for name, st in stages.items()) / 3600
    out = capsys.readouterr().out
    assert [x for x in out.splitlines() if x.startswith("vanilla | ")][0].endswith(
        f"| {hours:,.1f}")
    assert cli.main(["ablate", "--table", "modifications", "--estimate", "--compiled",
                     str(log)]) == 2
    assert "add --topology" in capsys.readouterr().err


def _stage_compile(cfg, topo, hbm_bytes=0):
    """The compiler child's function in the next test: a fitting report naming its process;
    XSum's step (inputs 1,024) kills the process, as libtpu's compiler does on some meshes."""
    import os
    import signal
    if cfg.data.feature_lengths["inputs"] > 512:
        os.kill(os.getpid(), signal.SIGSEGV)
    return {"fits": True, "chips": topo.chips, "expected_step_seconds": 0.1,
            "bytes_per_chip": {"total": GiB}, "pid": os.getpid()}


def test_each_stage_compiles_in_a_child_of_its_own(monkeypatch):
    """The estimate compiles each distinct step in a fresh child process that exits after it
    (one process holding T5 Large's three compiles outgrew a 24 GB host); a child that dies
    is a one-line error naming the stage, and the estimate's process lives on."""
    import os
    monkeypatch.setattr(estimation, "COMPILE_TARGET", f"{__name__}:_stage_compile")
    cache = {}
    reports = [estimation.compile_report(_stages("vanilla")[name], TOPO, cache)
               for name in ("pretrain", "finetune_super_glue", "finetune_web_questions")]
    pids = [r["pid"] for r in reports]
    # SuperGLUE and WebQuestions are one step (step_key): compiled once
    assert pids[1] == pids[2] and len(set(pids)) == 2 and os.getpid() not in pids
    for pid in pids:  # the children have exited
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(UserError, match="finetune.*xsum.*SIGSEGV"):
        estimation.compile_report(_stages("vanilla")["finetune_xsum"], TOPO, cache)
    assert len(cache) == 2


def _fitting_compile(cfg, topo, hbm_bytes=0):
    """The compiler child's function in the next test: every step fits; XSum's (inputs
    1,024) is five times the others'."""
    slow = cfg.data.feature_lengths["inputs"] > 512
    return {"fits": True, "chips": topo.chips, "expected_step_seconds": 0.5 if slow else 0.1,
            "bytes_per_chip": {"total": GiB}, "compiled": True, "mesh": [1, 4, 1]}


def _refuse_compile(cfg, topo, hbm_bytes=0):
    raise AssertionError("compiled a stage the file holds")


def test_ablate_compiled_file_keeps_what_the_estimate_compiles(tmp_path, monkeypatch, capsys):
    """`--compiled FILE` that does not exist yet: every stage compiled is appended as its
    compile finishes, after a line a killed run cut short; run again, nothing is compiled and
    the TPU-hours are the same."""
    import json

    from t5lite.cli import main as cli
    log = tmp_path / "new.jsonl"
    args = ["ablate", "--table", "modifications", "--estimate", "--topology", TOPO,
            "--rows", "vanilla", "--compiled", str(log)]
    monkeypatch.setattr(estimation, "COMPILE_TARGET", f"{__name__}:_fitting_compile")
    assert cli.main(args) == 0
    first = capsys.readouterr().out
    assert "no such file yet" in first
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert sorted(x["stage"] for x in lines) == ["finetune_super_glue", "finetune_xsum",
                                                 "pretrain"]
    assert {x["row"] for x in lines} == {"vanilla"} and all(x["fits"] for x in lines)
    log.write_text(log.read_text() + '{"row": "vani')  # a killed run's last line
    monkeypatch.setattr(estimation, "COMPILE_TARGET", f"{__name__}:_refuse_compile")
    assert cli.main(args) == 0
    again = capsys.readouterr().out
    row = [x for x in again.splitlines() if x.startswith("vanilla | ")]
    assert row == [x for x in first.splitlines() if x.startswith("vanilla | ")] and row
    stages = _stages("vanilla")
    hours = 4 * sum((st.cfg.train.steps - st.start) * (
        0.5 if name == "finetune_xsum" else 0.1) for name, st in stages.items()) / 3600
    assert row[0].endswith(f"| {hours:,.1f}")
    # a third run that compiles one more row appends after the cut line, not onto it
    monkeypatch.setattr(estimation, "COMPILE_TARGET", f"{__name__}:_fitting_compile")
    assert cli.main(args[:-3] + ["swiglu", "--compiled", str(log)]) == 0
    text = log.read_text().splitlines()
    assert text[3] == '{"row": "vani' and json.loads(text[4])["row"] == "swiglu"
