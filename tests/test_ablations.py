"""The T5 paper's ablation tables (t5lite/ablations.py, configs/ablations/): every row builds a
valid config with the intended change, the change reaches the data (noise density, span
length, mixing rates), dry-run prints commands that rebuild the same configs, the renderer,
the CLI, and one real two-row run of Table 6 on the small synthetic data dir (with resume)."""

import json
import math
import os
import shlex

import numpy as np
import pytest

import train_helpers
from t5lite import ablations, cli
from t5lite import config as config_lib
from t5lite.errors import UserError

TABLES = ("table2", "table4", "table5", "table6", "table7", "table10", "table11")


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


@pytest.mark.parametrize("scale", ["tiny", "paper"])
@pytest.mark.parametrize("name", TABLES)
def test_every_row_gives_valid_configs(name, scale):
    table, plans = _plans(name, scale, tasks=tuple(ablations.DOWNSTREAM))
    for row in table.rows:
        pre, fts = plans[row.name]
        assert pre.workdir == f"/w/{name}/{row.name}/pretrain"
        assert [ft.task for ft in fts] == list(ablations.DOWNSTREAM)
        for ft in fts:
            assert ft.cfg.checkpoint.init_from == pre.workdir
            assert ft.cfg.data.mixture_or_task.startswith(ft.task)
            # the model the finetuning stage builds is the pretrained one
            assert ft.cfg.model.architecture == pre.cfg.model.architecture
            assert ft.cfg.model.num_decoder_layers == pre.cfg.model.num_decoder_layers
            assert ft.cfg.model.d_model == pre.cfg.model.d_model
        # the plain overrides are the whole story: reloading from them gives the same config
        assert config_lib.load_config(pre.config, pre.overrides) == pre.cfg
    if scale == "paper":
        assert all(p.cfg.model.d_model == 768 for p, _ in plans.values())


def test_table2_sets_the_architecture():
    for scale, n in (("tiny", 2), ("paper", 12)):
        _, plans = _plans("table2", scale)
        for name, (pre, (ft,)) in plans.items():
            arch, objective = name.split("_")
            for m in (pre.cfg.model, ft.cfg.model):
                assert m.architecture == {"lm": "decoder_only", "prefixlm": "prefix_lm"}.get(
                    arch, "encoder_decoder")
                assert m.shared_encoder_decoder == (arch == "shared")
                layers = n // 2 if arch == "half" else n
                assert m.num_decoder_layers == layers
                if m.architecture == "encoder_decoder":
                    assert m.num_encoder_layers == layers
            want = {"denoising": "corpus_iid_denoising",
                    "lm": "corpus_lm" if arch == "lm" else "corpus_prefix_lm"}[objective]
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
    base_pre, _ = plans[table.baseline]
    for row in table.rows:
        pre, _ = plans[row.name]
        assert row.multitask == (row.name != "baseline")
        if row.multitask:
            assert pre.cfg.train.steps == 2 * base_pre.cfg.train.steps
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
    with pytest.raises(UserError, match="one of tiny, paper"):
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
    assert lines[2].startswith(f"t5lite eval --checkpoint {wd}/table11/k18/pretrain --task "
                               "sentiment --split test --set decode.max_length=4")


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
    for name, acc, bleu in (("rate15", 71.5, 3.25), ("rate50", 64.0, None)):
        metrics = {"sentiment/accuracy": acc}
        if bleu is not None:
            metrics["translate_en_de/bleu"] = bleu
        d = tmp_path / "table6" / name
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({"metrics": metrics, "scale": "tiny"}))
    lines = ablations.render(table, str(tmp_path)).splitlines()
    assert lines[2] == "| Corruption rate | sentiment accuracy | translate_en_de bleu |"
    assert lines[4] == "| ★ 15% | 71.50 | 3.25 |"
    assert lines[5] == "| 50% | 64.00 | – |"
    assert lines[-1].endswith("Not run yet: rate10, rate25.") and "Scale: tiny" in lines[-1]


SMALL = ["model.d_model=32", "model.num_heads=2", "model.head_dim=16", "model.d_ff=64",
         "model.num_encoder_layers=1", "model.num_decoder_layers=1", "model.vocab_size=768",
         "train.prepare_data=()", "train.log_every=1"]


@pytest.fixture
def test_scale(monkeypatch):
    """A few steps at 32 input tokens; the rows' `:=` lengths follow (they see L = 32)."""
    train_helpers.enable_compilation_cache()  # the rows' finetuning programs are the same
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
        assert math.isfinite(float(row.split("|")[2]))
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
