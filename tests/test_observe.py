"""Watching a run (issue 20): profiler trace, step-time split, goodput across resumes, plots,
progress lines in log files, CLI help, LoRA merge command, seqio cache."""

import glob
import io
import json
import os

import numpy as np
import pytest

from t5lite import config as config_lib
from t5lite.errors import UserError
from t5lite import progress
from t5lite.monitor import profiler
from t5lite.train import trainer
from train_helpers import tf_iterator, tiny_config


def _rows(workdir, split="train"):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r["split"] == split]


def test_profile_window_writes_a_trace_and_goodput_survives_a_resume(tmp_path, capsys,
                                                                    caplog):
    cfg = tiny_config()
    cfg.train.steps, cfg.train.profile_steps = 4, "1:3"
    cfg.checkpoint.every_steps = 2
    workdir = str(tmp_path / "run")
    final = trainer.train(cfg, workdir, train_iter=tf_iterator(cfg),
                          eval_iter_fn=lambda: tf_iterator(cfg, seed=1))
    out = capsys.readouterr()
    text = out.out + out.err
    assert "compiling the train step ..." in text and "compiled the train step in" in text
    assert f"profiling steps 2-3 -> {workdir}/profile" in text
    traces = glob.glob(os.path.join(workdir, "profile", "plugins", "profile", "*", "*"))
    assert any(t.endswith(".xplane.pb") for t in traces), traces
    assert any(t.endswith(".trace.json.gz") for t in traces), traces
    rows = _rows(workdir)
    for key in ("data_wait_s", "compute_s", "checkpoint_s", "goodput"):
        assert key in rows[-1], rows[-1]
    assert rows[2]["checkpoint_s"] > 0  # saved after step 2 was logged: counted in step 3
    (g1,) = _rows(workdir, "goodput")
    assert 0 < g1["goodput"] < 1 and g1["restarts"] == 0 and g1["lost_s"] == 0
    assert g1["compile_s"] > 0 and g1["eval_s"] > 0 and g1["startup_s"] > 0
    assert final["goodput"] == pytest.approx(g1["goodput"])
    assert "goodput " in text

    # pretend the run had gone on past its last checkpoint (step 4) and was lost: resuming
    # from step 4 counts the productive seconds after it as lost to the restart
    path = os.path.join(workdir, "goodput.json")
    acc = json.load(open(path))
    acc["runs"][-1]["seconds"]["step"] += 100.0
    acc["runs"][-1]["ended"] += 100.0
    with open(path, "w") as f:
        json.dump(acc, f)
    cfg6 = config_lib.copy_config(cfg)
    cfg6.train.steps, cfg6.train.profile_steps = 6, ""
    trainer.train(cfg6, workdir, train_iter=tf_iterator(cfg),
                  eval_iter_fn=lambda: tf_iterator(cfg, seed=1), allow_config_change=True)
    acc = json.load(open(path))
    assert len(acc["runs"]) == 2 and acc["runs"][1]["first_step"] == 4
    s = acc["summary"]
    assert s["restarts"] == 1 and s["lost_s"] == pytest.approx(100.0, abs=1.0)
    assert s["wall_s"] > 100 and s["goodput"] < 0.5

    # a corrupt newest checkpoint: eval / infer fall back with one warning line (not
    # TensorStore's spec) and no orbax absl notes
    import logging
    from t5lite.store import checkpointing
    for f in glob.glob(os.path.join(workdir, "checkpoints", "6", "params", "ocdbt.process_0",
                                    "d", "*")):
        with open(f, "wb") as fh:
            fh.write(b"garbage")
    caplog.set_level(logging.INFO)
    with progress.quiet_absl():
        checkpointing.load_params(workdir)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "\n" not in warned[0] and "checkpoints/6" in warned[0], warned


def test_profile_steps_must_be_a_window():
    assert profiler.parse_steps("") is None and profiler.parse_steps("10:15") == (10, 15)
    for bad in ("15:10", "x", "3", "-1:2"):
        with pytest.raises(UserError, match="profile_steps"):
            profiler.parse_steps(bad)


def test_closed_event_loop_noise_is_dropped_and_other_unraisables_are_not(monkeypatch):
    import sys
    import types
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    progress.drop_closed_event_loop_noise()
    progress.drop_closed_event_loop_noise()  # once only
    for exc in (RuntimeError("Event loop is closed"), RuntimeError("other"), ValueError("x")):
        sys.unraisablehook(types.SimpleNamespace(exc_value=exc, object=None))
    assert [str(u.exc_value) for u in seen] == ["other", "x"]


def test_progress_off_a_terminal_prints_plain_lines(monkeypatch):
    monkeypatch.setenv("T5LITE_PROGRESS_SECONDS", "0")
    buf = io.StringIO()  # not a TTY, like a SLURM .out file
    bar = progress.bar(total=5, desc="eval", unit="ex", file=buf)
    assert isinstance(bar, progress.LineTqdm)
    for i in range(5):
        bar.update(1)
        bar.set_postfix(loss=i)
    bar.close()
    text = buf.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert lines[0].startswith("eval: 0/5") and lines[-1].startswith("eval: 5/5 (100%)")
    assert "loss=4" in lines[-1]


def test_logged_progress_lines_show_each_steps_own_metrics(tmp_path, monkeypatch, capsys):
    """Off a terminal, the line printed for step N carries step N's loss and learning rate
    (not those of the step logged before it), and no per-line "mfu=n/a"."""
    from t5lite.monitor import writers
    monkeypatch.setenv("T5LITE_PROGRESS_SECONDS", "0")
    logger = writers.MetricsLogger(str(tmp_path), total_steps=30, enabled=True)
    for step in (10, 20, 30):
        logger.write(step, {"loss": step / 10, "lr": step * 1e-4, "tokens_per_s": 100.0})
    logger.close()
    out = capsys.readouterr()
    lines = [ln for ln in (out.out + out.err).splitlines() if ln.startswith("train: ")]
    shown = [int(ln.split()[1].split("/")[0]) for ln in lines]
    assert 10 in shown and 30 in shown, lines  # tqdm may skip a middle one
    for step, line in zip(shown, lines):
        if step:
            assert f"loss={step / 10:.4f}" in line and f"lr={step * 1e-4:.2e}" in line, line
    assert not any("mfu" in ln for ln in lines), lines


@pytest.mark.parametrize("schedule, warmup, steps, start, warned", [
    ("cosine", 100, 20, 0, True), ("linear", 20, 20, 0, True), ("constant", 19, 20, 0, False),
    ("rsqrt", 1000, 20, 0, False), ("cosine", 0, 20, 0, False), ("cosine", 100, 20, 20, False)])
def test_warmup_longer_than_the_run_is_warned_about(schedule, warmup, steps, start, warned):
    from t5lite.monitor import writers
    from t5lite.train import optim
    cfg = config_lib.Config()
    cfg.optim.schedule, cfg.optim.warmup_steps, cfg.optim.learning_rate = schedule, warmup, 1e-3
    line = writers.warmup_warning(cfg.optim, steps, start)
    assert bool(line) == warned, line
    if warned:  # the rate it names is the schedule's own at the last step
        last = float(optim.make_schedule(cfg.optim, steps)(steps - 1))
        assert f"ends at {last:.3g}" in line and "lower optim.warmup_steps" in line, line


def _wandb_records(path):
    """The records of a W&B offline run file (run-<id>.wandb): W&B's LevelDB-style log (a
    7-byte ":W&B" header, 32 KiB blocks of chunks: crc32 (4), length (2), type (1: whole,
    2 / 3 / 4: first / middle / last)), each record a wandb_internal_pb2.Record."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:8]
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header: padding
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


def test_metrics_go_to_weights_and_biases_when_asked(tmp_path, monkeypatch):
    """train.wandb_project: the same records in a W&B run (offline mode here), with the
    config; a resume continues the same W&B run, its records on the training step's axis."""
    from t5lite.monitor import writers
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    cfg = config_lib.Config()
    cfg.train.wandb_project, cfg.train.wandb_mode = "t5lite-test", "offline"
    workdir = str(tmp_path / "run")
    for start, losses in ((0, {1: 3.0, 2: 2.5, 3: 2.0}), (2, {3: 1.9})):  # then a resume at 2
        logger = writers.MetricsLogger(workdir, 3, start_step=start, enabled=True,
                                       progress_bar=False)
        logger.write_config(config_lib.to_dict(cfg))
        for step, loss in losses.items():
            logger.write(step, {"loss": loss, "grad_norm": float("nan")})
        logger.write(3, {"loss": 2.2}, prefix="eval")
        logger.close()
    import wandb
    wandb.teardown()  # W&B's service writes an offline run's file out when it stops
    run_id = json.load(open(os.path.join(workdir, "wandb_run.json")))["id"]
    runs = sorted(glob.glob(os.path.join(workdir, "wandb", f"offline-run-*-{run_id}",
                                         f"run-{run_id}.wandb")))
    assert len(runs) == 2, os.listdir(os.path.join(workdir, "wandb"))
    seen = []
    for path in runs:
        records = _wandb_records(path)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        assert run.run_id == run_id and run.project == "t5lite-test"
        config = {u.key: json.loads(u.value_json) for u in run.config.update}
        assert config["train"] == json.loads(json.dumps(config_lib.to_dict(cfg)["train"]))
        for r in records:
            if r.WhichOneof("record_type") == "history":
                row = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                       for i in r.history.item}
                seen.append({k: v for k, v in row.items() if not k.startswith("_")})
    assert seen == [{"step": 1, "train/loss": 3.0}, {"step": 2, "train/loss": 2.5},
                    {"step": 3, "train/loss": 2.0}, {"step": 3, "eval/loss": 2.2},
                    {"step": 3, "train/loss": 1.9}, {"step": 3, "eval/loss": 2.2}], seen


def test_wandb_online_without_a_login_is_one_line_naming_the_fix(tmp_path, monkeypatch):
    from t5lite.monitor import writers
    for var in ("HOME", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "home"))
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    cfg = config_lib.Config()
    cfg.train.wandb_project = "p"
    logger = writers.MetricsLogger(str(tmp_path / "run"), 3, enabled=True, progress_bar=False)
    with pytest.raises(UserError, match=r"^Weights & Biases: .*; run `wandb login`, or set "
                                        r"train.wandb_mode=offline") as e:
        logger.write_config(config_lib.to_dict(cfg))
    assert "\n" not in str(e.value)
    logger.close()


def test_wandb_asked_but_not_installed_says_how(tmp_path, monkeypatch):
    import sys
    from t5lite.monitor import writers
    monkeypatch.setitem(sys.modules, "wandb", None)
    cfg = config_lib.Config()
    cfg.train.wandb_project = "p"
    logger = writers.MetricsLogger(str(tmp_path), 3, enabled=True, progress_bar=False)
    with pytest.raises(UserError, match="wandb is not installed: pip install wandb"):
        logger.write_config(config_lib.to_dict(cfg))
    logger.close()
    # train() checks first, before the run writes anything: a run without wandb stops there
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    workdir = tmp_path / "run"
    with pytest.raises(UserError, match="wandb is not installed"):
        trainer.train(cfg, str(workdir))
    assert not workdir.exists()
    cfg.train.wandb_project = ""
    writers.check_wandb(cfg.train)


# ----------------------------------------------------------------------------- plots


def _fake_run(workdir, steps=60, shift=0.0, task=True):
    os.makedirs(workdir, exist_ok=True)
    rng = np.random.default_rng(int(shift * 10))
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        for s in range(1, steps + 1):
            loss = 6 * np.exp(-s / 20) + 1.5 + shift + 0.2 * rng.random()
            f.write(json.dumps({"step": s, "split": "train", "loss": loss,
                                "accuracy": 1 - loss / 8, "lr": 1e-3 * min(1, s / 10)}) + "\n")
            if s % 20 == 0:
                f.write(json.dumps({"step": s, "split": "eval", "loss": loss + 0.1,
                                    "accuracy": 1 - loss / 7}) + "\n")
                if task:
                    f.write(json.dumps({"step": s, "split": "eval_tasks", "seconds": 3.0,
                                        "sentiment/accuracy": 50 + s / 3 - 10 * shift}) + "\n")
        f.write('{"step": 61, "split": "tr')  # a line cut short by a killed run


def _png(path):
    from PIL import Image
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def test_plot_writes_a_png_of_the_asked_size_with_curves(tmp_path):
    from t5lite.cli import main as cli
    a, b = str(tmp_path / "ablate" / "rate10" / "pretrain"), str(
        tmp_path / "ablate" / "rate50" / "pretrain")
    _fake_run(a)
    _fake_run(b, shift=0.5, task=False)
    out = str(tmp_path / "cmp.png")
    assert cli.main(["plot", a, b, "--output", out, "--size", "1000x700"]) == 0
    px = _png(out)
    assert px.shape == (700, 1000, 3)
    assert (px < 250).any(axis=-1).mean() > 0.03  # lines, labels, axes: not a blank page
    colors = {tuple(c) for c in px.reshape(-1, 3)[::7]}
    assert len(colors) > 50  # several colored curves, anti-aliased
    assert cli.main(["plot", a]) == 0 and _png(os.path.join(a, "metrics.png")).shape == (
        900, 1400, 3)
    from t5lite.monitor import plot
    assert plot.run_labels([a, b]) == ["rate10/pretrain", "rate50/pretrain"]
    assert cli.main(["plot", str(tmp_path / "nothing")]) == 2
    assert cli.main(["plot", a, "--size", "big"]) == 2


def test_ablation_chart_is_written_next_to_the_table(tmp_path):
    from t5lite.monitor import plot
    rows = [("i.i.d. 15%", {"sentiment/accuracy": 61.0, "translate_en_de/bleu": 3.1}, True),
            ("span 3", {"sentiment/accuracy": 64.5, "translate_en_de/bleu": 3.9}, False),
            ("not run", {}, False)]
    out = plot.ablation_chart("table6: corruption rate", rows, str(tmp_path / "table.png"))
    px = _png(out)
    assert px.shape == (700, 1200, 3) and (px < 250).any(axis=-1).mean() > 0.02
    assert plot.ablation_chart("t", [("x", {}, False)], str(tmp_path / "none.png")) is None


def test_ablate_writes_table_png_beside_table_md(tmp_path):
    from t5lite import ablations
    from t5lite.ablations import rendering
    table = ablations.load_table("table6")
    for name, acc in (("rate15", 71.5), ("rate50", 64.0)):
        d = tmp_path / "table6" / name
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({"metrics": {"sentiment/accuracy": acc}}))
    rendering.write_table(table, str(tmp_path))
    assert (tmp_path / "table6" / "table.md").exists()
    px = _png(str(tmp_path / "table6" / "table.png"))
    assert px.shape == (700, 1200, 3) and (px < 250).any(axis=-1).mean() > 0.02


# ----------------------------------------------------------------------------- CLI


def _all_actions(parser, prefix="t5lite"):
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all_actions(sub, f"{prefix} {name}")
        else:
            yield prefix, action


def test_every_cli_argument_has_help_and_choices_where_fixed(capsys):
    from t5lite.cli import main as cli
    parser = cli.build_parser()
    missing = [f"{cmd} {a.dest}" for cmd, a in _all_actions(parser)
               if not (a.help or "").strip()]
    assert not missing, missing
    acts = {(cmd, a.dest): a for cmd, a in _all_actions(parser)}
    assert list(acts[("t5lite ablate", "table")].choices)[:2] == ["table2", "table4"]
    assert list(acts[("t5lite ablate", "scale")].choices) == ["tiny", "small", "paper"]
    assert cli.main(["--version"]) == 0 and capsys.readouterr().out.startswith("t5lite 0.")
    assert cli.main(["eval", "--help"]) == 0
    assert "(default: validation)" in capsys.readouterr().out.replace("\n", " ")
    assert cli.main(["data", "prepare", "--help"]) == 0
    text = capsys.readouterr().out
    assert "translate_en_de" in text and "vocab_sp8k" in text
    assert cli.main(["ablate", "--table", "tabel6", "--workdir", "/w"]) == 2
    assert "Did you mean: table6" in capsys.readouterr().err


def test_train_print_config_shows_the_resolved_config_and_trains_nothing(tmp_path, capsys):
    from t5lite.cli import main as cli
    assert cli.main(["train", "--config", "quickstart", "--set", "train.steps=7",
                     "--print-config"]) == 0
    cfg = config_lib.from_dict(json.loads(capsys.readouterr().out))
    assert cfg.train.steps == 7 and cfg.name == "quickstart"
    assert cli.main(["train", "--config", "quickstart", "--set", "train.step=7",
                     "--print-config"]) == 2  # validated: did you mean train.steps?
    assert cli.main(["train", "--config", "quickstart"]) == 2  # no --workdir
    assert "--workdir" in capsys.readouterr().err


def test_listings_say_which_task_data_is_prepared(tmp_path, monkeypatch):
    from t5lite.cli import listings
    root = tmp_path / "data"  # sentiment and the BERT vocabulary prepared, nothing else
    files = {"finetune/sentiment/train.tsv": "good\tpositive\n", "vocab/bert/vocab.txt": "[PAD]\n"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    from t5lite import dataprep as ld
    manifest = {"format": 1, "datasets": {
        name: {"recipe": ld.DATASETS[name].recipe, "sources": {},
               "files": {rel: {"bytes": len(files[rel]), "sha256": ""}}}
        for name, rel in (("sentiment", "finetune/sentiment/train.tsv"),
                          ("vocab_bert", "vocab/bert/vocab.txt"))}}
    (root / "MANIFEST.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("T5LITE_DATA_DIR", str(root))
    text = listings.tasks_table()
    rows = {line.split()[0]: line for line in text.splitlines()[2:-1]}
    assert rows["sentiment_cls_bert"].endswith("  ready")
    assert rows["sentiment"].endswith("  prepare vocab_sp8k")
    assert rows["corpus_span_corruption"].endswith("  prepare corpus,vocab_sp8k")
    assert str(root) in text.splitlines()[-1]
    table = listings.models_table(["t5_1_0_small"])
    assert "60.5M" in table and listings.models_table(["t5_1_0_small"]) == table


def test_convert_export_of_a_lora_run_names_merge_lora_which_works(tmp_path, capsys):
    import flax.linen as nn
    import jax
    from t5lite.cli import main as cli
    from t5lite.models import dummy_batch
    from t5lite.peft import build_model
    from t5lite.store import checkpointing
    from t5lite.store.checkpointing import load_params
    cfg = config_lib.load_config("bert_tiny", ["model.peft.lora_rank=2"])
    batch = dummy_batch(cfg.model, 1, {"inputs": 8})
    params = nn.meta.unbox(build_model(cfg.model).init(jax.random.key(0), batch,
                                                        deterministic=True)["params"])
    params = jax.tree_util.tree_map_with_path(  # a trained (non-zero) LoRA B
        lambda p, v: v + 0.01 if "lora_b" in jax.tree_util.keystr(p) else v, params)
    src, merged = str(tmp_path / "lora"), str(tmp_path / "lora_merged")
    checkpointing.save_params_dir(src, cfg, jax.device_get(params))
    assert cli.main(["convert", "export", src, str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err
    assert f"t5lite convert merge-lora {src} {merged}" in err
    assert cli.main(["convert", "merge-lora", src, merged]) == 0
    mcfg, mparams = load_params(merged)
    flat = jax.tree_util.tree_leaves_with_path(mparams)
    assert mcfg.model.peft.lora_rank == 0 and not any("lora" in jax.tree_util.keystr(p)
                                                      for p, _ in flat)
    assert cli.main(["convert", "merge-lora", src, merged]) == 2  # never overwrites
    assert cli.main(["convert", "export", merged, str(tmp_path / "hf")]) == 0
    assert os.path.exists(tmp_path / "hf" / "model.safetensors")


# ----------------------------------------------------------------------------- seqio cache


@pytest.mark.parametrize("task,lengths,shards", [
    ("sentiment", {"inputs": 24, "targets": 4}, 2),
    ("corpus_span_corruption", {"inputs": 32, "targets": 8}, 1)])
def test_cached_task_trains_from_the_same_examples(data_dir, tmp_path, task, lengths, shards):
    """`t5lite data cache TASK` writes seqio's cache format; data.use_cached=true reads it and
    gives the examples preprocessing on the fly gives (the same batches from one shard; seqio
    interleaves several)."""
    import seqio
    from t5lite.cli import main as cli
    from t5lite.tasks import pipeline
    cache_dir = str(tmp_path / "cache")
    cfg = config_lib.Config()
    cfg.data.mixture_or_task, cfg.data.feature_lengths = task, lengths
    cfg.data.batch_size, cfg.data.pack = 2, shards == 1  # 30 validation rows: none dropped
    cfg.data.use_cached, cfg.data.cache_dir = True, cache_dir
    with pytest.raises(UserError, match=f"t5lite data cache {task}"):
        trainer.dataset_iterator(cfg, "train", shuffle=False)
    assert cli.main(["data", "cache", task, "--cache-dir", cache_dir, "--splits", "train",
                     "validation", "--shards", str(shards)]) == 0
    task_dir = os.path.join(cache_dir, task)
    files = sorted(os.listdir(task_dir))
    assert files[:5] == ["COMPLETED", "info.train.json", "info.validation.json",
                         "stats.train.json", "stats.validation.json"]
    assert files[5:] == [f"{split}.tfrecord-{i:05d}-of-{shards:05d}"
                         for split in ("train", "validation") for i in range(shards)]
    assert pipeline.get_mixture_or_task(task).cache_dir == task_dir  # seqio found it
    assert seqio.get_mixture_or_task(task).get_cached_stats("validation")["examples"] > 0
    cached = list(trainer.dataset_iterator(cfg, "validation", shuffle=False, num_epochs=1))
    fresh = list(pipeline.get_dataset(task, lengths, "encoder_decoder", 2, split="validation",
                                      shuffle=False, pack=cfg.data.pack,
                                      num_epochs=1).as_numpy_iterator())
    assert len(cached) == len(fresh) >= 2

    def rows(batches):
        keys = sorted(batches[0])
        return [tuple(np.concatenate([np.asarray(b[k])[i] for k in keys]).tolist())
                for b in batches for i in range(len(b[keys[0]]))]
    if shards == 1:
        assert rows(cached) == rows(fresh)
    else:
        assert sorted(rows(cached)) == sorted(rows(fresh))
