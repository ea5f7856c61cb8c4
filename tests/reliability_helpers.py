"""What the reliability tests share: the tiny run's command line, the CLI run in process, and
snapshot / assert_kept (every file that existed is still there, byte for byte)."""

import hashlib
import json
import os


from t5lite.cli import main as cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = [
    "model.vocab_size=768", "model.d_model=32", "model.num_heads=4", "model.head_dim=8",
    "model.d_ff=64", "model.num_encoder_layers=1", "model.num_decoder_layers=1",
    "data.feature_lengths={'inputs': 32, 'targets': 8}", "data.batch_size=8",
    "train.steps=4", "train.log_every=1", "train.eval_every=0", "train.eval_steps=0",
    "train.prepare_data=()", "checkpoint.every_steps=2", "checkpoint.keep=3",
]


def train_args(workdir, *extra, steps=None):
    args = ["train", "--config", "configs/quickstart.py", "--workdir", str(workdir)]
    for item in BASE + ([f"train.steps={steps}"] if steps else []):
        args += ["--set", item]
    return args + list(extra)


def run_cli(capsys, args):
    """-> (exit code, stderr lines that are t5lite's own, all output)."""
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    mine = [line for line in err.splitlines() if line.startswith("t5lite:")]
    return code, mine, out + err


def _in_flight(rel: str) -> bool:
    """A temporary file of a write in flight in a live run, gone a moment later, not history:
    our atomic writes (*.tmp), tf.train.Checkpoint's sharded save (<prefix>_temp/ with
    *.tempstate* parts: the data state) and orbax's *.orbax-checkpoint-tmp* directories."""
    parts = rel.split(os.sep)
    return (parts[-1].endswith(".tmp") or ".tempstate" in parts[-1]
            or any(p.endswith("_temp") or "orbax-checkpoint-tmp" in p for p in parts[:-1]))


def snapshot(workdir) -> dict:
    """relative path -> sha256 of every file (TensorBoard event files, the lock and in-flight
    temp files aside);
    "rows" -> the metrics records."""
    out = {}
    for dirpath, _, files in os.walk(workdir):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), workdir)
            if rel.startswith("tensorboard") or rel == ".lock" or _in_flight(rel):
                continue
            with open(os.path.join(dirpath, f), "rb") as fh:
                data = fh.read()
            # goodput.json is the run's time accounting: a resume appends its run to "runs"
            out[rel] = (json.loads(data)["runs"] if rel == "goodput.json"
                        else hashlib.sha256(data).hexdigest())
    return out


def rows_upto(workdir, step):
    return [r for r in metrics_rows(workdir) if r["step"] <= step]


def metrics_rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def assert_kept(before: dict, workdir, moved_step=None, metrics_upto=None, old_rows=None):
    """Every file of `before` is still there, byte for byte: in place, or (moved_step) under
    corrupt_checkpoints/<step>.<time>[.data_state]/. metrics.jsonl may only have lost lines
    after `metrics_upto` (the step it resumed from) and gained new ones."""
    after = snapshot(workdir)
    moved = {}
    if moved_step is not None:
        for rel, digest in after.items():
            parts = rel.split(os.sep)
            if parts[0] == "corrupt_checkpoints" and parts[1].startswith(f"{moved_step}."):
                sub = "data_state" if parts[1].endswith(".data_state") else "checkpoints"
                moved[os.path.join(sub, str(moved_step), *parts[2:])] = digest
    for rel, digest in before.items():
        if rel == "metrics.jsonl" and metrics_upto is not None:
            continue
        if rel == "config.json" and "config.1.json" in after and "config.1.json" not in before:
            assert after["config.1.json"] == digest, "the previous config was not kept"
            continue
        if rel == "goodput.json" and isinstance(after.get(rel), list):
            new = after[rel][:len(digest)]  # earlier runs kept; the last may have gone on
            assert new[:-1] == digest[:-1] and [(r["started"], r["first_step"]) for r in new] \
                == [(r["started"], r["first_step"]) for r in digest], "goodput.json lost runs"
            continue
        now = moved.get(rel) if moved_step is not None and rel.startswith((
            f"checkpoints/{moved_step}/", f"data_state/{moved_step}/")) else after.get(rel)
        assert now == digest, f"{rel} changed or vanished"
    if metrics_upto is not None:
        assert rows_upto(workdir, metrics_upto) == [r for r in old_rows
                                                    if r["step"] <= metrics_upto]
    return after


def _env(data_dir, devices=1):
    return dict(os.environ, T5LITE_DATA_DIR=data_dir, JAX_PLATFORMS="cpu",
                TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=ROOT,
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
