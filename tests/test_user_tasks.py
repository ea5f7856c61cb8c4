"""A user's own task module (t5lite/tasks/README.md): every mistake in it or its data is one
line and exit 2, found before compiling and with nothing written (an earlier run's workdir stays
byte-identical); `tasks show / list --task-module`; the module's file and hash saved with the
run, so eval works from another directory; infer's prefix warning; the JSONL reader."""

import hashlib
import os
import re
import subprocess
import sys

import pytest

from t5lite.cli import main as cli

TINY_CONFIG = '''
from t5lite.config import load_editable


def get_config():
    cfg = load_editable("quickstart_finetune")
    m = cfg.model
    m.d_model, m.num_heads, m.head_dim, m.d_ff = 32, 2, 16, 64
    m.num_encoder_layers = m.num_decoder_layers = 1
    cfg.data.batch_size, cfg.data.feature_lengths = 8, {"inputs": 32, "targets": 8}
    cfg.train.steps, cfg.train.eval_steps, cfg.train.prepare_data = 2, 1, ()
    cfg.checkpoint.every_steps = 2
    cfg.eval.every_steps, cfg.eval.max_examples, cfg.decode.max_length = 0, 4, 0
    return cfg
'''

MODULE = '''import functools, os
import seqio
from t5lite.tasks import metrics, registry, vocabularies

HERE = os.path.dirname(os.path.abspath(__file__))
vocab = vocabularies.get_vocabulary("t5lite_sp8k")
{before}
seqio.TaskRegistry.add(
    "{name}",
    source=seqio.TextLineDataSource({{"train": {train}, "validation": {dev}}}),
    preprocessors=[{parse}, functools.partial(registry.add_prefix, prefix="reverse:"),
                   seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
    output_features=registry.text_features(vocab), metric_fns=[metrics.{metric}])
{after}'''


def write_module(folder, stem, name, train="os.path.join(HERE, 'train.tsv')",
                 dev="os.path.join(HERE, 'dev.tsv')", parse="registry.parse_tsv",
                 metric="accuracy", before="", after="") -> str:
    for data in ("train.tsv", "dev.tsv"):
        if not os.path.exists(os.path.join(folder, data)):
            write_tsv(os.path.join(folder, data), 10)
    path = os.path.join(folder, f"{stem}.py")
    with open(path, "w") as f:
        f.write(MODULE.format(name=name, train=train, dev=dev, parse=parse, metric=metric,
                              before=before, after=after))
    return path


def write_tsv(path, n, bad_line=0):
    with open(path, "w") as f:
        for i in range(1, n + 1):
            words = f"good film {i} the plot"
            f.write(f"{words}\n" if i == bad_line else f"{words}\t{words.split()[0][::-1]}\n")


def tree_hashes(root) -> dict:
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def train_args(config, workdir, module, task, *more):
    return ["train", "--config", config, "--workdir", workdir,
            "--set", f"data.task_modules=({module!r},)", "--set", f"data.mixture_or_task={task}",
            "--set", f"eval.best_metric={task}/accuracy", *more]


@pytest.fixture(scope="module")
def project(data_dir, tmp_path_factory):
    """A user's project folder (data, a task module imported by name) and one tiny run
    trained from it: {"dir", "config", "workdir", "module"}."""
    root = tmp_path_factory.mktemp("user_project")
    write_tsv(root / "train.tsv", 40)
    config = str(root / "tiny_user_config.py")
    (root / "tiny_user_config.py").write_text(TINY_CONFIG)
    module = write_module(str(root), "ut46_good_tasks", "ut46_reverse")
    workdir = str(root / "runs" / "first")
    old = os.getcwd()
    os.chdir(root)
    try:
        assert cli.main(train_args(config, workdir, "ut46_good_tasks", "ut46_reverse")) == 0
    finally:
        os.chdir(old)
    return {"dir": str(root), "config": config, "workdir": workdir, "module": module}


def refused(project, capfd, module, task, *more, match=""):
    """Run the mistaken command on the earlier run's workdir: exit 2, one line on stderr
    (matching ``match``), every file of the workdir as it was. -> the line."""
    before = tree_hashes(project["workdir"])
    capfd.readouterr()
    rc = cli.main(train_args(project["config"], project["workdir"], module, task, *more))
    err = capfd.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("t5lite: error: "), err
    assert match in lines[0], lines[0]
    assert tree_hashes(project["workdir"]) == before
    return lines[0]


def test_syntax_error_names_file_and_line(project, tmp_path, capfd):
    path = write_module(str(tmp_path), "ut46_syntax", "ut46_syntax", before="x = (1,")
    refused(project, capfd, path, "ut46_syntax", match=f"{path}:7: '(' was never closed")


def test_missing_data_file_names_path_and_split(project, tmp_path, capfd):
    path = write_module(str(tmp_path), "ut46_nofile", "ut46_nofile",
                        dev="os.path.join(HERE, 'no_such_dev.tsv')")
    line = refused(project, capfd, path, "ut46_nofile", match="split 'validation'")
    assert os.path.join(str(tmp_path), "no_such_dev.tsv") in line


def test_malformed_tsv_line_names_file_and_line(project, tmp_path, capfd):
    write_tsv(tmp_path / "bad.tsv", 30, bad_line=7)
    path = write_module(str(tmp_path), "ut46_badline", "ut46_badline",
                        train="os.path.join(HERE, 'bad.tsv')")
    line = refused(project, capfd, path, "ut46_badline", match="line 7 has 1 tab-separated")
    assert f"{tmp_path / 'bad.tsv'} line 7" in line and "inputs<TAB>targets" in line


def test_column_names_the_features_need(project, tmp_path, capfd):
    path = write_module(
        str(tmp_path), "ut46_columns", "ut46_columns",
        parse="functools.partial(registry.parse_tsv, field_names=('inputs', 'label'))")
    line = refused(project, capfd, path, "ut46_columns",
                   match="after its preprocessors the examples have inputs, label, not targets")
    # no "inputs" column: add_prefix, which reads it, is the step that fails
    path = write_module(
        str(tmp_path), "ut46_columns2", "ut46_columns2",
        parse="functools.partial(registry.parse_tsv, field_names=('text', 'label'))")
    line = refused(project, capfd, path, "ut46_columns2", match="reads the feature 'inputs'")
    assert "parse_tsv makes text, label" in line


def test_task_name_taken_or_registered_twice(project, tmp_path, capfd):
    path = write_module(str(tmp_path), "ut46_shadow", "sentiment")
    refused(project, capfd, path, "sentiment", match="'sentiment' is a t5lite built-in")
    import seqio
    assert "t5lite" in repr(seqio.TaskRegistry.get("sentiment").source)  # the built-in stays
    twice = write_module(str(tmp_path), "ut46_twice", "ut46_twice",
                         after="seqio.TaskRegistry.add('ut46_twice', source=seqio."
                               "TextLineDataSource({'train': 'x'}), preprocessors=[], "
                               "output_features={})\n")
    refused(project, capfd, twice, "ut46_twice", match=f"{twice}:14: the task name "
            "'ut46_twice' is registered twice")
    assert "ut46_twice" not in seqio.TaskRegistry.names()  # a failed module registers nothing
    via_registry = write_module(str(tmp_path), "ut46_replace", "ut46_replace",
                                after="registry.register_finetune_task('sentiment', "
                                      "'sentiment', 'x:')\n")
    refused(project, capfd, via_registry, "ut46_replace", match="'sentiment' is a t5lite")


def test_unknown_metric_lists_the_metrics(project, tmp_path, capfd):
    path = write_module(str(tmp_path), "ut46_metric", "ut46_metric", metric="acuracy")
    line = refused(project, capfd, path, "ut46_metric", match="has no 'acuracy'")
    assert "sequence_accuracy" in line and f"{path}:13" in line
    path = write_module(str(tmp_path), "ut46_metric2", "ut46_metric2",
                        before="from t5lite.tasks.metrics import acuracy")
    refused(project, capfd, path, "ut46_metric2", match=f"{path}:7: t5lite.tasks.metrics has "
            "no 'acuracy'; its metrics are accuracy, f1_binary (f1),")


def test_misspelt_best_metric_writes_nothing(project, tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(project["dir"])
    refused(project, capfd, "ut46_good_tasks", "ut46_reverse",
            "--set", "eval.best_metric=ut46_reverse/acuracy", match="did you mean "
            "'ut46_reverse/accuracy'")
    new = tmp_path / "runs" / "new"
    capfd.readouterr()
    rc = cli.main(train_args(project["config"], str(new), "ut46_good_tasks", "ut46_reverse",
                             "--set", "eval.best_metric=ut46_reverse/acuracy"))
    assert rc == 2 and not new.parent.exists()  # so the corrected command starts clean


def test_tasks_show_and_list_take_task_module(data_dir, tmp_path, capfd, monkeypatch):
    write_module(str(tmp_path), "ut46_show_tasks", "ut46_show")
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    assert cli.main(["tasks", "show", "ut46_show", "--task-module", "ut46_show_tasks",
                     "--num-examples", "1"]) == 0
    out = capfd.readouterr().out
    assert "inputs" in out and "reverse: good film 1" in out
    assert cli.main(["tasks", "list", "ut46", "--task-module", "ut46_show_tasks",
                     "--wide"]) == 0
    row = next(x for x in capfd.readouterr().out.splitlines() if x.startswith("ut46_show"))
    assert row.split()[1:3] == ["task", "inputs,targets"] and row.endswith("ready")


def test_run_saves_module_file_and_eval_works_from_elsewhere(project, tmp_path):
    import json
    from t5lite.tasks import user_modules
    with open(os.path.join(project["workdir"], "config.json")) as f:
        saved = json.load(f)["data"]["task_module_files"]
    assert saved == [user_modules.record(project["module"])]
    with open(project["module"], "a") as f:
        f.write("# edited after training\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "t5lite.cli", "eval", "--workdir", project["workdir"],
         "--task", "ut46_reverse", "--max-examples", "4"],
        cwd=elsewhere, capture_output=True, text=True, timeout=600,
        # not the project folder, which importing the module by name put on sys.path here
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in sys.path if os.path.abspath(p or ".") != project["dir"])))
    assert out.returncode == 0, out.stderr
    assert "ut46_reverse/accuracy" in out.stdout
    warnings = [x for x in out.stderr.splitlines() if "warning" in x]
    assert len(warnings) == 1 and "changed since this run was trained" in warnings[0]


def test_infer_warns_about_a_user_tasks_prefix(project, tmp_path, capfd):
    lines = tmp_path / "in.txt"
    lines.write_text("good film the plot\n")
    capfd.readouterr()
    assert cli.main(["infer", "--workdir", project["workdir"], "--input", str(lines)]) == 0
    err = capfd.readouterr().err
    assert "whose inputs start with 'reverse:'" in err and "--prefix 'reverse:'" in err


def test_parse_jsonl_reads_named_keys_and_names_a_bad_line(data_dir, tmp_path, capfd):
    import json
    rows = [{"question": f"good film {i}", "answer": i} for i in range(4)]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    parse = "functools.partial(registry.parse_jsonl, json_keys=('question', 'answer'))"
    path = write_module(str(tmp_path), "ut46_jsonl", "ut46_jsonl", parse=parse,
                        train="os.path.join(HERE, 'qa.jsonl')", dev="os.path.join(HERE, "
                        "'qa.jsonl')")
    capfd.readouterr()
    assert cli.main(["tasks", "show", "ut46_jsonl", "--task-module", path,
                     "--num-examples", "2"]) == 0
    out = capfd.readouterr().out
    assert "reverse: good film 1" in out and re.search(r"targets \(\d+ tokens\): 1\n", out)
    (tmp_path / "bad.jsonl").write_text(json.dumps(rows[0]) + "\n" + '{"question": "x"}\n')
    bad = write_module(str(tmp_path), "ut46_jsonl_bad", "ut46_jsonl_bad", parse=parse,
                       train="os.path.join(HERE, 'bad.jsonl')", dev="os.path.join(HERE, "
                       "'bad.jsonl')")
    assert cli.main(["tasks", "show", "ut46_jsonl_bad", "--task-module", bad]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{tmp_path / 'bad.jsonl'} line 2 has no key 'answer'" in err[0]
