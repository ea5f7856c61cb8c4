"""The third journey as a newcomer meets it: their own generative task, registered as
t5lite/tasks/README.md shows and trained with README's exact command ("Your own task").

README's command inherits quickstart_finetune's lengths (targets 4: sentiment's labels). A
task whose targets are longer used to train on cut targets without a word (task accuracy 0.00,
"new best"); now the run refuses in one line, before writing anything, with the --set that fits
the task, and with that --set it learns the task.
"""

import json
import os
import random
import re
import shlex
import subprocess
import sys

import sentencepiece as spm

import tasks_testdata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODULE = '''import functools, os
import seqio
from t5lite.tasks import metrics, registry, vocabularies

DATA = os.environ.get("MY_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                              "my_data"))
vocab = vocabularies.get_vocabulary("t5lite_sp8k")

seqio.TaskRegistry.add(  # "words" -> the same words reversed
    "my_reverse",
    source=seqio.TextLineDataSource({"train": f"{DATA}/train.tsv",
                                     "validation": f"{DATA}/dev.tsv"}),
    preprocessors=[registry.parse_tsv, functools.partial(registry.add_prefix, prefix="reverse:"),
                   seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
    output_features=registry.text_features(vocab), metric_fns=[metrics.accuracy])
'''


def readme_train_command() -> list[str]:
    """The `t5lite train` command README gives under "train on your task"."""
    text = open(os.path.join(ROOT, "README.md")).read()
    after = text[text.index("train on your task:"):]
    block = re.search(r"```bash\n(.*?)```", after, re.S).group(1)
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:2] == ["t5lite", "train"], argv
    return argv


def _write_project(folder, data_dir) -> None:
    """my_tasks.py and my_data/{train,dev}.tsv: four words, each one piece of the test
    vocabulary, and the same words reversed (400 / 100 lines, as the issue's newcomer): a
    target is 5 tokens with its EOS, one more than quickstart_finetune's targets length."""
    sp = spm.SentencePieceProcessor(model_file=os.path.join(data_dir, "vocab",
                                                            "t5lite_sp8k.model"))
    words = [w for w in tasks_testdata._WORDS if len(sp.encode(w)) == 1][:8]
    assert len(words) == 8, words
    rng = random.Random(0)
    os.makedirs(folder / "my_data")
    for name, n in (("train.tsv", 400), ("dev.tsv", 100)):
        with open(folder / "my_data" / name, "w") as f:
            for _ in range(n):
                ws = [rng.choice(words) for _ in range(4)]
                f.write(f"{' '.join(ws)}\t{' '.join(reversed(ws))}\n")
    (folder / "my_tasks.py").write_text(MODULE)


def _run(argv, cwd, data_dir):
    env = dict(os.environ, T5LITE_DATA_DIR=data_dir, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
               TF_CPP_MIN_LOG_LEVEL="3", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    return subprocess.run([sys.executable, "-m", "t5lite.cli", *argv[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1200)


def test_readmes_command_on_a_generative_task_refuses_then_learns_it(tmp_path):
    data_dir = tasks_testdata.make_data_dir(str(tmp_path / "data"))
    project = tmp_path / "project"
    project.mkdir()
    _write_project(project, data_dir)
    argv = [a.replace("my_reviews", "my_reverse") for a in readme_train_command()]
    # vocab_sp8k is the test data dir's own (preparing the real one builds the 65 MB corpus:
    # tests/test_dataprep.py)
    argv = [a if not a.startswith("train.prepare_data=") else "train.prepare_data=()"
            for a in argv]

    refused = _run(argv, project, data_dir)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("t5lite:")]
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert "sampled targets" in lines[0] and "would be cut" in lines[0], lines[0]
    assert not (project / "runs").exists()  # nothing written
    fix = re.search(r"--set '(data\.feature_lengths=\{.*?\})'", lines[0]).group(1)

    trained = _run(argv + ["--set", fix], project, data_dir)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "lengths: every sampled example fits" in trained.stdout + trained.stderr
    with open(project / "runs" / "mine" / "best" / "metrics.json") as f:
        best = json.load(f)
    # chance is 1 in 8^4 (0.02%); cut targets scored exactly 0 (a model trained from scratch,
    # 600 steps: no pretraining to start from in a test)
    assert best["my_reverse/accuracy"] > 10, best
