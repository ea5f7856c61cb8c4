"""`t5lite models` and `t5lite tasks list` without TensorFlow: the task catalog agrees with
seqio's registries, and the one-layer parameter count with the full trace."""

import json
import os
import subprocess
import sys

import pytest

from t5lite import config as config_lib
from t5lite import task_catalog
from t5lite.models import _counts, abstract_params, layerwise_counts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_models_and_tasks_list_do_not_import_tensorflow(tmp_path):
    script = (
        "import json, sys\n"
        "from t5lite.cli import main as cli\n"
        "codes = [cli.main(['models']), cli.main(['tasks', 'list'])]\n"
        "heavy = sorted(m for m in ('tensorflow', 'seqio', 'tensorflow_datasets') "
        "if m in sys.modules)\n"
        "print(json.dumps({'codes': codes, 'heavy': heavy}))\n")
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu",
               T5LITE_DATA_DIR=str(tmp_path / "data"), XDG_CACHE_HOME=str(tmp_path / "cache"),
               HOME=str(tmp_path))  # a cold start: nothing cached anywhere
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    *table, last = proc.stdout.strip().splitlines()
    assert json.loads(last) == {"codes": [0, 0], "heavy": []}
    out = "\n".join(table)
    assert "t5_1_0_small" in out and "60.5M" in out  # models
    assert "corpus_span_corruption" in out and "prepare corpus,vocab_sp8k" in out  # tasks


def test_task_catalog_is_what_seqio_registers():
    """Every built-in task and mixture, as `tasks list` shows it, equals the seqio registry's:
    tasks/builtin.py registers exactly task_catalog's specs, so a recipe that registers
    something other than its spec says (features, vocabulary, metrics, members, the data it
    reads), or a task registered outside the catalog, fails here.
    The registry is read in a fresh process: other tests register their own tasks into this
    process's seqio registry (test_formats' glue_* on fixtures), which `tasks list` would not
    show a user."""
    env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", "import json; from t5lite.tasks import registered; "
         "print(json.dumps(registered.task_rows()))"],
        env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    live = json.loads(proc.stdout.strip().splitlines()[-1])
    catalog = [{"cells": r.cells(), "needs": list(r.needs)} for r in task_catalog.rows()]
    names = {r["cells"][0] for r in catalog}, {r["cells"][0] for r in live}
    assert names[0] == names[1], (
        f"registered but not in t5lite/task_catalog.py: {sorted(names[1] - names[0])}; "
        f"in the catalog but not registered: {sorted(names[0] - names[1])}")
    assert catalog == live


@pytest.mark.parametrize("name", ["t5_1_0_tiny", "t5_1_1_tiny", "bert_tiny", "gpt2_tiny",
                                  "tiny_gpt_classify", "tiny_bert_sentiment", "electra_tiny",
                                  "tiny_spanbert"])
def test_layerwise_counts_equal_the_full_trace(name):
    cfg = config_lib.load_config(name).model
    assert layerwise_counts(cfg) == _counts(abstract_params(cfg))


@pytest.mark.slow
def test_layerwise_counts_of_every_model_config():
    for name in sorted(n for n in config_lib.available_configs() if "/" not in n):
        cfg = config_lib.load_config(name).model
        assert layerwise_counts(cfg) == _counts(abstract_params(cfg)), name


def _row_names(text: str) -> list[str]:
    """The first cell of each table row: the lines between the header's rule and the footer
    (which a terminal's width may fold onto several lines)."""
    lines = text.splitlines()
    return [line.split()[0] for line in lines[2:next(
        i for i, line in enumerate(lines) if line.startswith("data: "))]]


def _record_prepared(root, name: str) -> None:
    """MANIFEST.json listing ``name`` at its current recipe with one file of the recorded
    size: what dataprep.is_prepared checks, without building the dataset."""
    from t5lite import dataprep
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "stand-in"), "w") as f:
        f.write("x")
    entry = {"recipe": dataprep.DATASETS[name].recipe, "sources": {},
             "files": {"stand-in": {"bytes": 1}}}
    dataprep.manifest.write_manifest(root, {"format": 1, "datasets": {name: entry}})
    assert dataprep.is_prepared(name, root)


@pytest.mark.parametrize("prepared", [False, True], ids=["nothing_prepared", "vocab_t5_ready"])
@pytest.mark.parametrize("data_dir_name", ["d", "a-data-dir-whose-path-folds-the-footer" * 2])
def test_tasks_list_folds_to_the_terminal_and_filters_by_name(monkeypatch, capsys, tmp_path,
                                                              data_dir_name, prepared):
    """A terminal gets the table cut to its width (members folded to a count and the first
    names, long cells end in "…", features / vocabulary dropped when still too wide); a name
    filter is a substring or a glob; a pipe (or --wide) gets every cell. The data dir is the
    test's own, at a short and at a long path, with the paper's vocabulary missing or ready:
    the data column and the footer (and so every fold) depend on them."""
    from t5lite.cli import listings
    from t5lite.cli import main as cli
    from t5lite.errors import UserError
    root = str(tmp_path / data_dir_name)
    monkeypatch.setenv("T5LITE_DATA_DIR", root)
    if prepared:
        _record_prepared(root, "vocab_t5")
    for width in (80, 100, 160):
        lines = listings.tasks_table(width=width).splitlines()
        assert max(len(line) for line in lines) <= width, width
        assert set(_row_names("\n".join(lines))) >= {"paper_glue", "sentiment"}
    text = listings.tasks_table("paper_glue", width=100)
    names = _row_names(text)
    assert names[-1] == "paper_glue" and all(n.startswith("paper_glue") for n in names)
    assert len(names) == 12 and "…" in text
    # the data column is "ready" or "prepare vocab_t5" (shrunk), which leaves the members
    # column more or less room
    assert ("8: paper_glue_cola, " if prepared else "8: paper_glue_…") in text
    assert "inputs,targets" in text and "t5_spiece.model" in text  # room enough: kept
    wide = listings.tasks_table("paper_glue")
    assert " + ".join(sorted(n for n in names if n.count("_") == 2)[:8]) in wide
    glob = listings.tasks_table("paper_glue_m*")
    assert _row_names(glob) == [
        "paper_glue_mnli", "paper_glue_mnli_matched", "paper_glue_mnli_mismatched",
        "paper_glue_mrpc"]
    with pytest.raises(UserError, match="no task or mixture matches 'paper_glu_cola'. Did you "
                                        "mean: paper_glue_cola"):
        listings.tasks_table("paper_glu_cola")
    assert cli.main(["tasks", "list", "glue"]) == 0  # captured, as a pipe: every cell
    assert "paper_glue_cola + paper_glue_mnli + " in capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", "90")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # a 90-column terminal
    assert cli.main(["tasks", "list", "glue"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 90 and "paper_super_glue " in out
    assert cli.main(["tasks", "list", "glue", "--wide"]) == 0
    assert "paper_glue_cola + paper_glue_mnli + " in capsys.readouterr().out


def test_tasks_show_names_berts_special_tokens():
    """BERT's decode drops [CLS] / [SEP] and stops at the first [SEP]; `tasks show` names them
    where they stand, so a sentence pair shows both sentences and MLM shows its masks."""
    from t5lite import dataprep
    from t5lite.tasks import registered, vocabularies
    dataprep.build.ensure_prepared(["vocab_bert", "vocab_t5"])
    bert = vocabularies.get_vocabulary("bert")
    cat, sat = bert.encode("the cat"), bert.encode("sat down")
    ids = [bert.CLS] + cat[:1] + [bert.MASK] + [bert.SEP] + sat + [bert.SEP]
    assert registered._decode(bert, ids) == "[CLS] the [MASK] [SEP] sat down [SEP]"
    assert bert.decode(ids) == "the [MASK]"  # what a plain decode shows
    sp = vocabularies.get_vocabulary("t5")  # others: their own decode, unchanged
    assert registered._decode(sp, sp.encode("the cat")) == "the cat"
