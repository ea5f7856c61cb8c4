"""The T5 paper's ablation tables (t5lite/ablations/, configs/ablations/): every row builds a
valid config with the intended change, the change reaches the data (noise density, span
length, mixing rates), dry-run prints commands that rebuild the same configs, the renderer,
the CLI, and one real two-row run of Table 6 on the small synthetic data dir (with resume).
The settings at the paper's scale are checked in tests/test_ablations_paper.py."""

import json
import math
import os
import shlex

import numpy as np
import pytest

from t5lite import ablations
from t5lite.ablations import runner
from t5lite.cli import main as cli
from t5lite import config as config_lib
from t5lite.errors import UserError


T5_TABLES = ("table2", "table4", "table5", "table6", "table7", "table8", "table9", "table10",
             "table11", "table12", "table13", "table14", "table4_bart")
# Narang et al. 2021's table: its rows are planned in tests/test_modifications.py
TABLES = T5_TABLES + ("modifications", "modifications_learned")


def _plans(name, scale="tiny", tasks=("sentiment",)):
    table = ablations.load_table(name)
    return table, {r.name: ablations.plan_row(table, r, "/w", tasks, scale) for r in table.rows}


def test_table_files_are_the_listed_tables():
    assert tuple(ablations.table_names()) == TABLES
    listing = ablations.list_tables()
    for name in TABLES:
        table = ablations.load_table(name)
        assert table.name == name and table.caption in listing
        assert not table.baseline or table.baseline in [r.name for r in table.rows]


def test_small_scale_finetunes_on_topic_debian_and_reports_its_whole_test_split():
    """--scale small's default downstream is the 51-section topic task (5,861 test examples,
    where sentiment's 351 cannot measure the effects); tiny keeps the table's sentiment."""
    table = ablations.load_table("table2")
    assert ablations.SCALES["small"].tasks == ("topic_debian",)
    assert not ablations.SCALES["tiny"].tasks and table.tasks == ("sentiment",)
    assert ablations.DOWNSTREAM["topic_debian"].test_examples == 0  # the whole split
    pre, (ft,) = ablations.plan_row(table, table.row("encdec_denoising"), "/w",
                                    ("topic_debian",), "small")
    assert ft.cfg.data.mixture_or_task == "topic_debian" and ft.cfg.optim.learning_rate == 5e-3
    assert ft.cfg.optim.schedule == "linear"
    assert ft.cfg.eval.best_metric == "topic_debian/accuracy"
    # section names are at most 5 pieces of the 8k vocabulary (+ EOS)
    assert ft.cfg.data.feature_lengths["targets"] == ft.cfg.decode.max_length == 8
    assert ft.cfg.checkpoint.init_from == pre.workdir and pre.cfg.train.steps == 1200


@pytest.mark.parametrize("scale", ["tiny", "small", "paper"])
@pytest.mark.parametrize("name", T5_TABLES)
def test_every_row_gives_valid_configs(name, scale):
    table, plans = _plans(name, scale, tasks=tuple(ablations.DOWNSTREAM))
    for row in table.rows:
        pre, fts = plans[row.name]
        if not row.pretrained:
            assert pre is None and all(not ft.cfg.checkpoint.init_from for ft in fts)
            continue
        if row.leave_one_out:  # a pretraining per task (tests/test_ablation_scaling.py)
            assert pre is None and all(ft.cfg.checkpoint.init_from == ft.source.workdir
                                       for ft in fts)
            continue
        assert pre.workdir == f"/w/{name}/{row.name}/pretrain"
        assert [ft.task for ft in fts] == list(ablations.DOWNSTREAM)
        for ft in fts:  # (a task trained from scratch has no init: Narang et al.'s WMT)
            scratch = ablations.DOWNSTREAM[ft.task].from_scratch
            assert ft.cfg.checkpoint.init_from == ("" if scratch else pre.workdir)
            assert ft.cfg.data.mixture_or_task.replace("paper_", "", 1).startswith(
                ft.task.removesuffix("_scratch"))
            # the model the finetuning stage builds is the pretrained one
            assert ft.cfg.model.architecture == pre.cfg.model.architecture
            assert ft.cfg.model.num_decoder_layers == pre.cfg.model.num_decoder_layers
            assert ft.cfg.model.d_model == pre.cfg.model.d_model
        # the plain overrides are the whole story: reloading from them gives the same config
        assert config_lib.load_config(pre.config, pre.overrides) == pre.cfg
    if scale == "paper" and name == "table14":  # T5's sizes (tests/test_table14.py)
        assert {p.cfg.model.d_model for p, _ in plans.values()} == {512, 768, 1024}
    elif scale == "paper":
        # T5 base, but Table 13's bigger models (T5's 2x / 4x: d_model 1024)
        assert all(p.cfg.model.d_model == (1024 if n.startswith("size") else 768)
                   for n, (p, _) in plans.items() if p)


def test_table2_sets_the_architecture():
    for scale, n in (("tiny", 2), ("paper", 12)):
        _, plans = _plans("table2", scale)
        for name, (pre, (ft,)) in plans.items():
            if name == "no_pretraining":
                continue
            arch, objective = name.split("_")
            for m in (pre.cfg.model, ft.cfg.model):
                assert m.architecture == {"lm": "decoder_only", "prefixlm": "prefix_lm"}.get(
                    arch, "encoder_decoder")
                assert m.shared_encoder_decoder == (arch == "shared")
                layers = n // 2 if arch == "half" else n
                assert m.num_decoder_layers == layers
                if m.architecture == "encoder_decoder":
                    assert m.num_encoder_layers == layers
            want = {"denoising": "corpus_iid_denoising_lm" if arch == "lm"
                    else "corpus_iid_denoising",
                    "lm": "corpus_lm" if arch == "lm" else "corpus_prefix_lm"}[objective]
            if scale == "paper":  # the same objectives on C4
                want = want.replace("corpus_", "c4_")
            assert pre.cfg.data.mixture_or_task == want


def _noise_stats(task_name, lengths, n=24):
    """(noise density, mean noise span length) measured on the task's examples."""
    import seqio
    task = seqio.get_mixture_or_task(task_name)
    vocab_size = task.output_features["targets"].vocabulary.vocab_size
    noise = total = spans = 0
    for ex in task.get_dataset(lengths, split="train", shuffle=False, seed=0).take(n):
        inputs, targets = ex["inputs"].numpy()[:-1], ex["targets"].numpy()[:-1]  # no EOS
        sentinels = int(np.sum(inputs >= vocab_size - 100))
        noise += len(targets) - int(np.sum(targets >= vocab_size - 100))
        total += len(inputs) - sentinels + len(targets) - int(np.sum(targets >= vocab_size - 100))
        spans += sentinels
    return noise / total, noise / spans


def test_table6_noise_density_reaches_the_data(data_dir):
    _, plans = _plans("table6")
    for name, (pre, _) in plans.items():
        density, _ = _noise_stats(pre.cfg.data.mixture_or_task, pre.cfg.data.feature_lengths)
        assert density == pytest.approx(int(name[len("rate"):]) / 100, abs=0.03), name


def test_table7_span_length_reaches_the_data(data_dir):
    _, plans = _plans("table7")
    for name, (pre, _) in plans.items():
        density, span = _noise_stats(pre.cfg.data.mixture_or_task, pre.cfg.data.feature_lengths)
        assert density == pytest.approx(0.15, abs=0.03), name
        want = 1 / 0.85 if name == "iid" else int(name[len("span"):])  # i.i.d.: geometric
        assert span == pytest.approx(want, rel=0.25), name


def test_table10_changes_only_finetuning():
    table, plans = _plans("table10")
    base_pre, (base_ft,) = plans[table.baseline]
    for name, (pre, (ft,)) in plans.items():
        assert pre.cfg == config_lib.load_config(base_pre.config, base_pre.overrides)
        p = ft.cfg.model.peft
        assert p.adapter_dim == (int(name[len("adapters"):]) if "adapters" in name else 0)
        if p.adapter_dim:
            assert "*_norm/*" in p.train_also and "class_dense/*" in p.train_also
        layers = ft.cfg.model.num_encoder_layers  # encoder and decoder open in parallel
        assert p.unfreeze_every == (ft.cfg.train.steps // layers
                                    if name == "gradual_unfreezing" else 0)


def test_table11_mixtures_and_rates(data_dir):
    import seqio
    from t5lite.tasks import ablation_tasks
    table, plans = _plans("table11")
    base_pre, (base_ft,) = plans[table.baseline]
    for row in table.rows:
        pre, _ = plans[row.name]
        assert row.multitask == (row.name != "baseline")
        if row.multitask:
            assert pre.cfg.train.steps == base_pre.cfg.train.steps + base_ft.cfg.train.steps
            assert "topic_brown" in pre.cfg.train.prepare_data
    sizes = {t: seqio.get_mixture_or_task(t).num_input_examples("train")
             for t in ablation_tasks.multitask_members()}
    k16 = seqio.get_mixture_or_task(plans["k16"][0].cfg.data.mixture_or_task)
    t4 = seqio.get_mixture_or_task(plans["t4"][0].cfg.data.mixture_or_task)
    equal = seqio.get_mixture_or_task(plans["equal"][0].cfg.data.mixture_or_task)
    for task in k16.tasks:
        n = sizes[task.name]
        assert k16.get_rate(task) == min(n, 2 ** 16 // 32)
        assert t4.get_rate(task) == pytest.approx(min(n, 2 ** 21 // 32) ** 0.25)
        assert equal.get_rate(task) == 1.0


def test_computed_overrides_and_user_overrides_by_stage():
    table = ablations.load_table("table6")
    row = table.row("rate50")
    pre, (ft,) = ablations.plan_row(table, row, "/w", ("sentiment",), overrides=[
        "train.seed=3", "pretrain.train.steps=7", "finetune.data.batch_size=8"])
    assert pre.cfg.train.seed == ft.cfg.train.seed == 3
    assert pre.cfg.train.steps == 7 and ft.cfg.train.steps != 7
    assert ft.cfg.data.batch_size == 8 and pre.cfg.data.batch_size != 8
    assert pre.cfg.data.feature_lengths == {"inputs": 128,
                                           "targets": ablations.iid_targets(128, 0.5)}
    # user overrides adjust the scale under the rows: the rows' computed values follow them
    pre, _ = ablations.plan_row(table, row, "/w", ("sentiment",), overrides=[
        "data.feature_lengths={'inputs': 64, 'targets': 8}"])
    assert pre.cfg.data.feature_lengths == {"inputs": 64,
                                           "targets": ablations.iid_targets(64, 0.5)}
    t2 = ablations.load_table("table2")
    pre, (ft,) = ablations.plan_row(t2, t2.row("half_lm"), "/w", ("sentiment",), overrides=[
        "model.num_encoder_layers=6", "model.num_decoder_layers=6"])
    assert pre.cfg.model.num_encoder_layers == ft.cfg.model.num_decoder_layers == 3
    t10 = ablations.load_table("table10")
    _, (ft,) = ablations.plan_row(t10, t10.row("gradual_unfreezing"), "/w", ("sentiment",),
                                  overrides=["finetune.train.steps=1200"])
    assert ft.cfg.model.peft.unfreeze_every == 1200 // 2  # 2 + 2 layers, opened in parallel
    # `:=` sees the overrides before it; every key appears once in the plain list
    plain, cfg = ablations.resolve("quickstart", ["data.feature_lengths.inputs=64",
                                                  "train.steps:=L * 2", "train.steps=5",
                                                  "train.seed:=cfg.train.steps + 1"])
    assert plain == ["data.feature_lengths.inputs=64", "train.steps=5", "train.seed=6"]
    assert cfg.train.steps == 5 and cfg.train.seed == 6
    with pytest.raises(UserError, match="Did you mean"):
        ablations.resolve("quickstart", ["train.stesp=5"])
    with pytest.raises(UserError, match="cannot compute"):
        ablations.resolve("quickstart", ["train.steps:=undefined_name + 1"])
    with pytest.raises(UserError, match="Did you mean: sentiment"):
        ablations.run("table6", "/w", tasks=["sentimnt"], dry_run=True)
    with pytest.raises(UserError, match="one of tiny, small, paper"):
        ablations.run("table6", "/w", scale="huge", dry_run=True)


def test_dry_run_prints_commands_that_rebuild_the_configs(tmp_path, capsys):
    wd = str(tmp_path / "abl")
    ablations.run("table6", wd, rows=["rate10"], dry_run=True)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "# table6 / rate10: 10%"
    assert lines[1].startswith(f"t5lite train --config configs/quickstart.py --workdir "
                               f"{wd}/table6/rate10/pretrain ")
    assert "--set data.mixture_or_task=corpus_iid_denoising_rate10" in lines[1]
    assert "--set data.feature_lengths.targets=32" in lines[1]
    assert lines[2].startswith("t5lite train --config configs/quickstart_finetune.py "
                               f"--workdir {wd}/table6/rate10/finetune_sentiment ")
    assert f"--set checkpoint.init_from={wd}/table6/rate10/pretrain" in lines[2]
    assert lines[3] == (f"t5lite eval --checkpoint {wd}/table6/rate10/finetune_sentiment/best "
                        "--task sentiment --split test")
    assert len(lines) == 4 and not os.path.exists(wd)
    table = ablations.load_table("table6")
    pre, (ft,) = ablations.plan_row(table, table.row("rate10"), wd, ("sentiment",))
    for line, stage in ((lines[1], pre), (lines[2], ft)):
        args = cli.build_parser().parse_args(shlex.split(line)[1:])
        assert args.workdir == stage.workdir
        assert config_lib.load_config(args.config, args.set) == stage.cfg
    # a multi-task row: no finetuning, the pretrained params are tested directly
    ablations.run("table11", wd, rows=["k18"], dry_run=True)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and "multitask_k18" in lines[1]
    assert lines[2].startswith(f"t5lite eval --checkpoint {wd}/table11/k18/pretrain/checkpoints/"
                               "STEP --task sentiment --split test --set decode.max_length=4")


def test_cli_list_and_errors(capsys):
    assert cli.main(["ablate", "--list"]) == 0
    out = capsys.readouterr().out
    assert "★ rate15" in out and "Adapter layers, d = 2048" in out
    assert cli.main(["ablate", "--table", "tabel6", "--workdir", "/w", "--dry-run"]) == 2
    assert "Did you mean: table6" in capsys.readouterr().err
    assert cli.main(["ablate", "--table", "6", "--workdir", "/w", "--rows", "rate11",
                     "--dry-run"]) == 2
    assert "Did you mean: rate15" in capsys.readouterr().err
    # rows and tasks: space- or comma-separated
    assert cli.main(["ablate", "--table", "table6", "--workdir", "/w", "--rows", "rate10,rate25",
                     "rate50", "--tasks", "sentiment", "--dry-run"]) == 0
    heads = [l for l in capsys.readouterr().out.splitlines() if l.startswith("# table6")]
    assert [h.split(":")[0] for h in heads] == [
        "# table6 / rate10", "# table6 / rate25", "# table6 / rate50"]


def test_render_from_result_files(tmp_path):
    table = ablations.load_table("table6")
    for name, runs in (("rate15", {"0": {"sentiment/accuracy": 71.5,
                                         "translate_en_de/bleu": 3.25},
                                   "1": {"sentiment/accuracy": 72.5,
                                         "translate_en_de/bleu": 3.75}}),
                       ("rate50", {"0": {"sentiment/accuracy": 64.0}}),
                       ("rate25", {"0": {"sentiment/accuracy": 71.0}})):
        mean, std = runner.summarize(runs)  # pylint: disable=protected-access
        d = tmp_path / "table6" / name
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({"metrics": mean, "std": std, "runs": runs,
                                                   "scale": "tiny", "split": "test"}))
    lines = ablations.render(table, str(tmp_path)).splitlines()
    assert lines[2] == ("| Corruption rate | sentiment accuracy | translate_en_de bleu | "
                        + " | ".join(f"{c} (paper)" for c in ablations.PAPER_COLUMNS) + " |")
    # mean ± std over seeds; bold within 2 std (the baseline's, 0.71) of the best (72.0)
    # not run: the paper's numbers only; bold within 2 x its baseline std (0.235) of 83.28
    assert lines[4].startswith("| 10% | – | – | **82.82** |")
    assert lines[5].startswith("| ★ 15% | **72.00 ± 0.71** | **3.50 ± 0.35** | **83.28** |")
    assert lines[6].startswith("| 25% | **71.00** | – | **83.00** |")
    assert lines[7].startswith("| 50% | 64.00 | – | 81.27 |")
    assert "mean ± std over 2 seeds" in lines[-3] and "Not run yet: rate10." == lines[-1]


def test_render_of_a_cached_study_knows_the_benchmark_members(tmp_path):
    """A fresh process that only renders finished results (nothing run, planned or tested
    first) still folds GLUE / SuperGLUE members into their averages: one column each, no
    column per member task."""
    import subprocess
    import sys
    from t5lite.tasks import formats
    assert ablations.DOWNSTREAM["glue"].members == tuple(formats.PAPER_GLUE)
    assert ablations.DOWNSTREAM["super_glue"].members == tuple(formats.PAPER_SUPERGLUE)
    runs = {"0": {"glue/average": 70.0, "paper_glue_cola/matthews_corrcoef": 40.0,
                  "paper_glue_cola/checkpoint_step": 5000.0, "paper_glue_sst2/accuracy": 90.0,
                  "super_glue/average": 60.0, "paper_super_glue_cb/accuracy": 60.0}}
    d = tmp_path / "table6" / "rate15"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"metrics": runs["0"], "std": {}, "runs": runs,
                                               "scale": "paper", "split": "validation"}))
    code = ("import sys; from t5lite import ablations; "
            "print(ablations.render(ablations.load_table('table6'), sys.argv[1]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, check=True).stdout
    header = out.splitlines()[2]
    assert header == ("| Corruption rate | glue average | super_glue average | "
                      + " | ".join(f"{c} (paper)" for c in ablations.PAPER_COLUMNS) + " |")
    assert "| ★ 15% | **70.00** | **60.00** |" in out


SMALL = ["model.d_model=32", "model.num_heads=2", "model.head_dim=16", "model.d_ff=64",
         "model.num_encoder_layers=1", "model.num_decoder_layers=1", "model.vocab_size=768",
         "train.prepare_data=()", "train.log_every=1"]


@pytest.fixture
def test_scale(monkeypatch):
    """A few steps at 32 input tokens; the rows' `:=` lengths follow (they see L = 32)."""
    monkeypatch.setitem(ablations.SCALES, "test", ablations.Scale(
        pretrain=("train.steps=3", "checkpoint.every_steps=3", "train.eval_steps=0",
                  "data.batch_size=8", "data.feature_lengths={'inputs': 32, 'targets': 16}"),
        finetune=("train.steps=2", "checkpoint.every_steps=2", "eval.every_steps=2",
                  "train.eval_steps=0", "data.batch_size=8", "eval.max_examples=8")))
    return "test"


@pytest.mark.slow
def test_two_rows_end_to_end_and_resume(data_dir, tmp_path, test_scale, capsys):
    """Table 6 rows 10% and 50% for a few steps of a small model, then a rerun (~70 s on an
    idle 2-core CPU: about 40 compiles)."""
    small = SMALL
    wd = str(tmp_path / "abl")
    results = ablations.run("table6", wd, rows=["rate10", "rate50"], scale=test_scale,
                            overrides=small)
    assert set(results) == {"rate10", "rate50"}
    for r in results.values():
        assert 0.0 <= r["metrics"]["sentiment/accuracy"] <= 100.0
        assert r["seconds"]["pretrain"] > 0 and r["seconds"]["finetune_sentiment"] > 0
    with open(os.path.join(wd, "table6", "rate50", "pretrain", "config.json")) as f:
        assert json.load(f)["data"]["feature_lengths"] == {
            "inputs": 32, "targets": ablations.iid_targets(32, 0.5)}
    table_md = open(os.path.join(wd, "table6", "table.md")).read()
    for label in ("| 10% |", "| 50% |"):
        row = next(line for line in table_md.splitlines() if line.startswith(label))
        assert math.isfinite(float(row.split("|")[2].strip().strip("*")))
    assert "Not run yet: rate15, rate25." in table_md
    capsys.readouterr()

    before = os.path.getmtime(os.path.join(wd, "table6", "rate10", "result.json"))
    again = ablations.run("table6", wd, rows=["rate10", "rate50"], scale=test_scale,
                          overrides=small)
    out = capsys.readouterr().out
    assert out.count("done earlier, skipped") == 4  # pretrain + finetune of both rows
    assert again == results
    assert os.path.getmtime(os.path.join(wd, "table6", "rate10", "result.json")) == before
    with pytest.raises(UserError, match="different config"):  # same workdir, other settings
        ablations.run("table6", wd, rows=["rate10"], scale=test_scale,
                      overrides=small + ["train.seed=1"])


@pytest.mark.slow
@pytest.mark.parametrize("table,row", [
    ("table2", "lm_denoising"), ("table2", "prefixlm_lm"), ("table2", "shared_lm"),
    ("table4", "deshuffling"), ("table5", "drop_tokens"), ("table7", "span10"),
    ("table10", "adapters32"), ("table10", "gradual_unfreezing"), ("table11", "t2")])
def test_each_kind_of_row_runs(data_dir, tmp_path, test_scale, table, row):
    """Other architectures, objectives, PEFT finetuning, a multi-task row: ~1 min each."""
    overrides = SMALL + (["model.num_encoder_layers=2", "model.num_decoder_layers=2"]
                         if table == "table10" else [])  # layers to unfreeze one by one
    (result,) = ablations.run(table, str(tmp_path), rows=[row], scale=test_scale,
                              overrides=overrides).values()
    assert 0.0 <= result["metrics"]["sentiment/accuracy"] <= 100.0
    assert ("finetune_sentiment" in result["seconds"]) == (table != "table11")
    if table == "table11":  # the best of the kept checkpoints on validation (the paper)
        assert result["metrics"]["sentiment/checkpoint_step"] in (1.0, 2.0, 3.0, 4.0, 5.0)


@pytest.mark.slow
def test_paper_scale_row_end_to_end_on_tfds_fixtures(data_dir, tmp_path):
    """--scale paper wiring on small TFDS fixtures: C4 pretraining, SQuAD finetuning, every
    kept checkpoint validated and the best reported (a tiny model and a few steps; the test
    vocabulary stands in for t5's)."""
    import seqio
    from test_formats import write_paper_tfds
    from t5lite.tasks import ablation_tasks
    root = write_paper_tfds(str(tmp_path / "tfds"))
    seqio.set_tfds_data_dir_override(root)
    ablation_tasks.register_paper("t5lite_sp8k")
    try:
        (result,) = ablations.run("table6", str(tmp_path / "abl"), rows=["rate10"],
                                  tasks=["squad"], scale="paper", overrides=SMALL + [
            "data.batch_size=8", "model.dtype=float32", "optim.warmup_steps=1",
            "pretrain.data.feature_lengths={'inputs': 32, 'targets': 16}",
            "pretrain.train.steps=3", "pretrain.checkpoint.every_steps=3",
            "pretrain.train.eval_every=0", "pretrain.train.eval_steps=0",
            "finetune.data.feature_lengths={'inputs': 64, 'targets': 16}",
            "finetune.train.steps=4", "finetune.checkpoint.every_steps=2",
            "finetune.train.eval_steps=0", "finetune.decode.max_length=8",
            "data.paper_vocabulary=t5lite_sp8k", "data.max_trimmed=1.0"]).values()
    finally:
        seqio.set_tfds_data_dir_override(None)
        ablation_tasks.register_paper("t5")
    assert result["split"] == "validation"
    assert 0.0 <= result["metrics"]["paper_squad/f1"] <= 100.0
    # finetuning continues at pretraining step 3 for 4 steps: checkpoints 4, 6, 7
    assert result["metrics"]["paper_squad/checkpoint_step"] in (4.0, 6.0, 7.0)
    with open(tmp_path / "abl" / "table6" / "rate10" / "pretrain" / "config.json") as f:
        assert json.load(f)["data"]["mixture_or_task"] == "c4_iid_denoising_rate10"
