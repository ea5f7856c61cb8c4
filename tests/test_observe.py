"""Watching a run (issue 20): profiler trace, step-time split, goodput across resumes, plots,
progress lines in log files, CLI help, LoRA merge command, seqio cache."""

import glob
import io
import json
import os

import numpy as np
import pytest

from t5lite import config as config_lib
from t5lite import observe, progress, trainer
from t5lite.errors import UserError
from train_helpers import tf_iterator, tiny_config


def _rows(workdir, split="train"):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r["split"] == split]


def test_profile_window_writes_a_trace_and_goodput_survives_a_resume(tmp_path, capsys):
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
                  eval_iter_fn=lambda: tf_iterator(cfg, seed=1))
    acc = json.load(open(path))
    assert len(acc["runs"]) == 2 and acc["runs"][1]["first_step"] == 4
    s = acc["summary"]
    assert s["restarts"] == 1 and s["lost_s"] == pytest.approx(100.0, abs=1.0)
    assert s["wall_s"] > 100 and s["goodput"] < 0.5


def test_profile_steps_must_be_a_window():
    assert observe.parse_steps("") is None and observe.parse_steps("10:15") == (10, 15)
    for bad in ("15:10", "x", "3", "-1:2"):
        with pytest.raises(UserError, match="profile_steps"):
            observe.parse_steps(bad)


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
