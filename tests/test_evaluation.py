"""Evaluation on a tiny checkpoint trained on the (synthetic) sentiment task: periodic seqio
evaluation with best-checkpoint keeping, `t5lite eval` and `t5lite infer` (predict / score /
rank) agreeing with each other and with decoding."""

import json
import math
import os

import numpy as np
import pytest

from t5lite import config as config_lib
from t5lite.cli import commands
from t5lite.errors import UserError
from t5lite.eval import evaluation


def _tiny_cfg(architecture):
    cfg = config_lib.Config(name="tiny_eval")
    m = cfg.model
    m.architecture = architecture
    m.vocab_size, m.d_model, m.num_heads, m.head_dim, m.d_ff = 768, 32, 2, 16, 64
    m.num_encoder_layers = m.num_decoder_layers = 1
    m.dropout_rate = 0.0
    if architecture != "encoder_decoder":
        m.position, m.max_length = "learned", 64
    cfg.data.mixture_or_task = "sentiment"
    cfg.data.feature_lengths = {"inputs": 24, "targets": 4}
    cfg.data.batch_size, cfg.data.pack = 8, False
    cfg.optim.name, cfg.optim.learning_rate = "adamw", 3e-3
    cfg.optim.schedule, cfg.optim.warmup_steps = "constant", 0
    cfg.train.steps, cfg.train.log_every, cfg.train.eval_steps = 4, 2, 1
    cfg.checkpoint.every_steps = 4
    cfg.eval.every_steps, cfg.eval.max_examples, cfg.eval.batch_size = 2, 16, 8
    cfg.eval.best_metric = "sentiment/accuracy"
    cfg.decode.max_length = 4
    return cfg


@pytest.fixture(scope="module")
def workdir(data_dir, tmp_path_factory):
    from t5lite.train import trainer
    wd = str(tmp_path_factory.mktemp("encdec"))
    trainer.train(_tiny_cfg("encoder_decoder"), wd)
    return wd


def _records(path, split):
    with open(os.path.join(path, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if r["split"] == split]


def test_periodic_eval_logs_metrics_and_keeps_the_best(workdir):
    evals = _records(workdir, "eval_tasks")
    assert [r["step"] for r in evals] == [2, 4]
    accs = [r["sentiment/accuracy"] for r in evals]
    assert all(0.0 <= a <= 100.0 for a in accs)
    best = os.path.join(workdir, "best")
    with open(os.path.join(best, "metrics.json")) as f:
        kept = json.load(f)
    assert kept["sentiment/accuracy"] == max(accs)
    assert kept["step"] == evals[int(np.argmax(accs))]["step"]  # first of equal bests
    cfg, _, _ = evaluation.load(best)
    assert cfg.eval.best_metric == "sentiment/accuracy"


def test_eval_command_matches_infer_predictions(workdir, data_dir, tmp_path, capsys):
    metrics = commands.eval_command(workdir, "sentiment", split="validation")
    table = capsys.readouterr().out
    assert "sentiment/accuracy" in table
    with open(os.path.join(data_dir, "finetune", "sentiment", "validation.tsv")) as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    inp = tmp_path / "in.txt"
    inp.write_text("".join(f"sst2 sentence: {x}\n" for x, _ in rows))
    out = tmp_path / "pred.jsonl"
    recs = commands.infer_command(workdir, str(inp), str(out), "predict")
    assert [json.loads(x) for x in out.read_text().splitlines()] == recs
    acc = 100.0 * np.mean([r["prediction"] == y for r, (_, y) in zip(recs, rows)])
    assert metrics["sentiment/accuracy"] == pytest.approx(acc)


def test_max_examples_is_a_seeded_sample_of_a_sorted_split(workdir, tmp_path, monkeypatch):
    # a validation split listing every positive first: the head of it would be one label
    import tasks_testdata
    root = tasks_testdata.label_sorted_data_dir(str(tmp_path / "sorted"), "validation", 200)
    monkeypatch.setenv("T5LITE_DATA_DIR", root)
    cfg, model, params = evaluation.load(workdir)
    (tmp_path / "log").mkdir()
    targets = []
    for step in (1, 2):  # the same sample at every evaluation
        evaluation.evaluate(cfg, model, params, tasks=("sentiment",), split="validation",
                            max_examples=40, log_dir=str(tmp_path / "log"), step=step)
        with open(tmp_path / "log" / f"sentiment-{step:06d}.jsonl") as f:
            targets.append([json.loads(line)["target"] for line in f])
    assert len(targets[0]) == 40 and targets[0] == targets[1]
    assert 10 <= targets[0].count("positive") <= 30, targets[0]


def _greedy_is_its_own_likelihood(checkpoint, texts):
    """Decoding scores == teacher-forced log-likelihood of the decoded ids (EOS included when
    emitted): ties decoding (KV cache) to scoring (one full forward pass)."""
    cfg, model, params = evaluation.load(checkpoint)
    in_vocab, _, add_eos = evaluation.io_vocabularies(cfg)
    pred = evaluation.Predictor(cfg, model, params, eos_id=1)
    ids = [list(in_vocab.encode(t)) + [1] * add_eos for t in texts]
    rows, scores = pred.predict(ids)
    # the decoded ids up to EOS, as generated (a 0 an undertrained model emits included)
    targets = [[int(t) for t in r][:list(r).index(1) + 1] if 1 in r else [int(t) for t in r]
               for r in rows]
    np.testing.assert_allclose(pred.score(ids, targets), scores, atol=1e-3)
    assert all(s < 0 for s in scores)


def test_infer_score_and_rank_agree(workdir, tmp_path, capsys):
    texts = ["sst2 sentence: the one was not there", "sst2 sentence: all of them"]
    _greedy_is_its_own_likelihood(workdir, texts)
    inp = tmp_path / "in.txt"
    inp.write_text("".join(t + "\n" for t in texts))
    ranked = commands.infer_command(workdir, str(inp), str(tmp_path / "r.jsonl"), "rank",
                                      options=["positive", "negative"])
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("".join(f"{t}\t{o}\n" for t in texts for o in ("positive", "negative")))
    scored = commands.infer_command(workdir, str(pairs), str(tmp_path / "s.jsonl"), "score")
    for i, r in enumerate(ranked):
        assert r["prediction"] == max(r["scores"], key=r["scores"].get)
        assert r["scores"]["positive"] == pytest.approx(scored[2 * i]["log_likelihood"], abs=1e-4)
        assert r["scores"]["negative"] == pytest.approx(scored[2 * i + 1]["log_likelihood"],
                                                        abs=1e-4)
        assert all(math.isfinite(v) and v < 0 for v in r["scores"].values())
    # --prefix: the same inputs without the task prefix in the lines; a warning without either
    raw = tmp_path / "raw.txt"
    raw.write_text("".join(t[len("sst2 sentence: "):] + "\n" for t in texts))
    with_prefix = commands.infer_command(workdir, str(raw), str(tmp_path / "p.jsonl"), "rank",
                                           options=["positive", "negative"],
                                           prefix="sst2 sentence:")
    assert [r["scores"] for r in with_prefix] == [r["scores"] for r in ranked]
    assert "warning" not in capsys.readouterr().err
    commands.infer_command(workdir, str(raw), str(tmp_path / "q.jsonl"), "rank",
                             options=["positive", "negative"])
    assert "--prefix 'sst2 sentence:'" in capsys.readouterr().err
    with pytest.raises(UserError, match="at least two --options"):
        commands.infer_command(workdir, str(inp), "-", "rank", options=["positive"])
    with pytest.raises(UserError, match="input<TAB>target"):
        commands.infer_command(workdir, str(inp), "-", "score")


def test_beam_search_through_overrides(workdir, tmp_path):
    inp = tmp_path / "in.txt"
    inp.write_text("sst2 sentence: the one was not there\n")
    rec = commands.infer_command(workdir, str(inp), "-", "predict",
                                   overrides=["decode.method=beam", "decode.beams=3",
                                              "decode.alpha=0.0"])[0]
    assert isinstance(rec["prediction"], str) and math.isfinite(rec["score"]) and rec["score"] < 0
    with pytest.raises(UserError, match="decode.method"):
        commands.infer_command(workdir, str(inp), "-", "predict",
                                 overrides=["decode.method=nucleus"])


def test_decoder_only_eval_and_infer(data_dir, tmp_path):
    from t5lite.train import trainer
    cfg = _tiny_cfg("decoder_only")
    cfg.eval.every_steps, cfg.train.steps = 0, 2
    wd = str(tmp_path / "gpt")
    final = trainer.train(cfg, wd)
    assert 0.0 <= final["eval/sentiment/accuracy"] <= 100.0
    _greedy_is_its_own_likelihood(wd, ["sst2 sentence: the one",
                                       "sst2 sentence: all of them were there"])


def test_training_saves_predictions_per_eval_step_and_config_for_tensorboard(workdir, caplog):
    """seqio's JSONLogger: what the model produced at each eval step; TensorBoard gets the
    resolved config as text and hparams; reading the run back logs no orbax warnings."""
    import logging
    pred_dir = os.path.join(workdir, "eval_predictions")
    for step in (2, 4):
        with open(os.path.join(pred_dir, f"sentiment-{step:06d}.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        assert len(rows) == 16 and {"prediction", "target"} <= set(rows[0])
        assert rows[0]["target"] in ("positive", "negative")
    from tensorboard.backend.event_processing import event_accumulator
    acc = event_accumulator.EventAccumulator(os.path.join(workdir, "tensorboard"),
                                             size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "config/text_summary" in tags["tensors"] and "train/loss" in tags["scalars"]
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"mixture_or_task": "sentiment"' in text
    assert "_hparams_/session_start_info" in acc.summary_metadata
    caplog.set_level(logging.INFO)
    evaluation.load(workdir)
    assert not [r for r in caplog.records if r.name == "absl" and r.levelno >= logging.WARNING]


def test_eval_and_infer_say_what_the_attention_kernel_runs(workdir, capsys):
    """`t5lite eval` / `infer` / `eval-shots` load through evaluation.load: "auto" says its
    pick and "flash" off a TPU says it runs interpreted, once, on stderr (infer's JSON lines
    may be stdout); xla says nothing."""
    for kernel, said in (("auto", "model.attention_kernel=auto on cpu: xla"),
                         ("flash", "model.attention_kernel=flash on cpu: the TPU kernel runs "
                                   "in Pallas interpret mode"), ("xla", None)):
        evaluation.load_ensemble([workdir, workdir], [f"model.attention_kernel={kernel}"])
        out, err = capsys.readouterr()
        lines = [ln for ln in err.splitlines() if "attention_kernel" in ln]
        assert "attention_kernel" not in out
        if said is None:
            assert lines == [], lines
        else:  # once for the two members
            assert len(lines) == 1 and lines[0].startswith(f"t5lite: {said}"), lines


def test_self_consistency_eval_through_overrides(workdir):
    """decode.method=self_consistency votes over the task's postprocessed answers; one sample
    per input scores exactly as plain sampling with the same seed."""
    def run(*overrides):
        cfg, model, params = evaluation.load(workdir, ["decode.temperature=2.0", *overrides])
        return evaluation.evaluate(cfg, model, params, tasks=("sentiment",), max_examples=16)
    sample = run("decode.method=sample")
    assert run("decode.method=self_consistency", "decode.num_samples=1") == sample
    voted = run("decode.method=self_consistency", "decode.num_samples=5")
    assert 0.0 <= voted["sentiment/accuracy"] <= 100.0
    with pytest.raises(UserError, match="num_samples"):
        run("decode.method=self_consistency", "decode.num_samples=0")


def test_a_resumed_run_keeps_the_best_so_far(tmp_path):
    """best/metrics.json (written by an earlier run, here the old way with open()) is the
    score a resumed run must beat; no best/ yet means any first evaluation wins."""
    cfg = _tiny_cfg("encoder_decoder")
    fresh = evaluation.TrainEvaluator(cfg, None, str(tmp_path), None)
    assert fresh.best is None
    os.makedirs(tmp_path / "best")
    with open(tmp_path / "best" / "metrics.json", "w") as f:
        json.dump({"step": 2, "sentiment/accuracy": 62.5}, f)
    assert evaluation.TrainEvaluator(cfg, None, str(tmp_path), None).best == 62.5
