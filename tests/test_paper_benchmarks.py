"""Every benchmark of the T5 paper's tables through `t5lite ablate`'s own path at `--scale
paper` (finetune -> every kept checkpoint validated -> the row's scores), on strict TFDS
fixtures (tests/tfds_fixtures.py: the builders' own split names, features and versions), with
a tiny model and a few steps. A split name, feature key or metric key that the real data sets
or the scoring do not have fails here, not after 2^19 steps of pretraining.

The tasks come from the catalog and ablations.SCALES["paper"], so a new benchmark is covered
without a change here (a new TFDS data set needs a few examples in tfds_fixtures.EXAMPLES).
"""

import re

import pytest
import seqio

import tfds_fixtures
import train_helpers
from t5lite import ablations, task_catalog
from t5lite.ablations import paper as paper_lib
from t5lite.ablations import plan

PAPER = ablations.SCALES["paper"]
BENCHMARKS = [s.name for s in task_catalog.task_specs() if s.recipe == "benchmark"]
# a tiny model and a few steps on the fixtures; the test vocabulary stands in for t5's. The
# lengths and decoding settings are the same for every task, so the compiled programs are
# shared across tasks (the compilation cache)
TINY = ["model.d_model=32", "model.num_heads=2", "model.head_dim=16", "model.d_ff=64",
        "model.num_encoder_layers=1", "model.num_decoder_layers=1", "model.vocab_size=768",
        "model.dtype=float32", "data.batch_size=8", "optim.warmup_steps=1",
        "train.log_every=1", "train.eval_steps=1", "eval.batch_size=8",
        "pretrain.data.feature_lengths={'inputs': 32, 'targets': 16}",
        "pretrain.train.eval_every=0",
        "finetune.data.feature_lengths={'inputs': 32, 'targets': 16}",
        "finetune.train.steps=2", "finetune.checkpoint.every_steps=2",
        "finetune.decode.max_length=4",
        # the fixtures' tasks are registered with the test vocabulary, and these wiring tests
        # decode 4 tokens of targets that are longer: cut targets accepted on purpose
        "data.paper_vocabulary=t5lite_sp8k", "data.max_trimmed=1.0"]


def _tfds_names(task_names) -> set:
    """The TFDS data sets (name/config:version) the registered tasks read."""
    out = set()
    for name in task_names:
        source = seqio.get_mixture_or_task(name).source
        if isinstance(source, seqio.TfdsDataSource):
            out.add(source.tfds_dataset.name)
    return out


def _split_map(task_name: str) -> dict:
    """Our split name -> the TFDS split a registered paper task reads."""
    source = seqio.get_mixture_or_task(task_name).source
    split_map = source.tfds_dataset._split_map or {}  # noqa: SLF001
    return {s: split_map.get(s, s) for s in source.splits}


@pytest.fixture(scope="module")
def paper_tfds(data_dir, tmp_path_factory):
    """Every data set of the paper's benchmarks and C4 as a strict TFDS fixture, and the
    `--scale paper` tasks registered over them with the test vocabulary (the t5 one restored
    afterwards)."""
    from t5lite.tasks import ablation_tasks
    root = tfds_fixtures.write_all(str(tmp_path_factory.mktemp("tfds")), _tfds_names(
        BENCHMARKS + task_catalog.paper_multitask_members()))
    seqio.set_tfds_data_dir_override(root)
    ablation_tasks.register_paper("t5lite_sp8k")
    yield root
    seqio.set_tfds_data_dir_override(None)
    ablation_tasks.register_paper("t5")


def test_fixtures_are_as_strict_as_tfds(paper_tfds):
    """A split name or feature key that TFDS's MNLI lacks fails on the fixture (mock_data's
    default would accept both)."""
    mnli = "glue/mnli:2.0.0"
    assert tfds_fixtures.builder_splits(mnli) == (
        "train", "validation_matched", "validation_mismatched", "test_matched",
        "test_mismatched")
    with pytest.raises(ValueError, match="Unknown split 'validation'"):
        seqio.TfdsDataSource(mnli, splits=["validation"]).get_dataset("validation")
    ds = seqio.TfdsDataSource(mnli, splits=["train"]).get_dataset("train")
    with pytest.raises(KeyError, match="sentence1"):
        ds.map(lambda x: x["sentence1"])
    tfds_fixtures.EXAMPLES["glue/mnli"].append({"sentence": "x", "label": 0, "idx": 9})
    try:  # an example with a key the builder lacks is not written
        with pytest.raises(Exception, match="Failed to encode example"):
            tfds_fixtures.write(str(paper_tfds) + "_bad", mnli)
    finally:
        tfds_fixtures.EXAMPLES["glue/mnli"].pop()
    with pytest.raises(AssertionError, match="cannot be loaded at version 9.9.9"):
        tfds_fixtures.write(str(paper_tfds) + "_bad", "glue/mnli:9.9.9")


def test_every_paper_split_is_one_its_builder_generates(data_dir):
    """No `--scale paper` task (benchmarks, C4 and Table 8's pretraining sets) declares a split
    (or maps one to a TFDS split or slice of one) that its TFDS builder does not generate; no
    data needed (the builders' own split lists)."""
    names = [s.name for s in task_catalog.task_specs() if s.paper]
    checked = set()
    for name in names:
        source = seqio.get_mixture_or_task(name).source
        if not isinstance(source, seqio.TfdsDataSource):
            continue  # e.g. the Toronto Books Corpus: the user's text files
        builder = tfds_fixtures.builder_splits(source.tfds_dataset.name)
        for split, tfds_split in _split_map(name).items():
            base = tfds_split.split("[")[0]  # "train[:99%]": a slice of train
            assert base in builder, f"{name}: {split} -> {tfds_split} not in {builder}"
        checked.add(name)
    assert set(BENCHMARKS) <= checked


def _read_splits(name: str, main: bool) -> None:
    """Read the task's main split (validation, which evaluation reads, or for a task only
    trained on, train), or its others: the examples pass the task's preprocessors (the
    builder's feature keys; the test splits' unlabeled examples) into the model's features."""
    task = seqio.get_mixture_or_task(name)
    splits = list(task.source.splits)
    first = "validation" if "validation" in splits else splits[0]
    for split in [first] if main else [s for s in splits if s != first]:
        exs = list(task.get_dataset({"inputs": 32, "targets": 16}, split=split, shuffle=False)
                   .take(2).as_numpy_iterator())
        assert exs and all(len(ex["inputs"]) and len(ex["targets"]) for ex in exs), (
            name, split)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_reads(paper_tfds, name):
    _read_splits(name, main=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_other_split_of_every_benchmark_reads(paper_tfds, name):
    _read_splits(name, main=False)


def _expected_metric_keys(key: str) -> set:
    """The metric keys the row of a DOWNSTREAM task must report at paper scale."""
    downstream = paper_lib.DOWNSTREAM[key]
    keys = set(downstream.metrics)
    for task in plan.eval_tasks(key):
        keys.add(f"{task}/checkpoint_step")
    return keys


# wmt_ende / wmt_enfr with --runslow only: wmt_enro runs the same task definition, finetune,
# checkpoint and BLEU path (their sources: test_every_benchmark_reads)
@pytest.mark.parametrize("key", [pytest.param(k, marks=pytest.mark.slow)
                                 if k in ("wmt_ende", "wmt_enfr") else k for k in PAPER.tasks])
def test_paper_benchmark_finetunes_evaluates_and_scores(paper_tfds, tmp_path, key):
    """Table 1's control row (finetuned from random params, no pretraining) at paper scale on
    the fixtures: the finetuning mixture's train and validation splits, every member task's
    best checkpoint on the report split, and the benchmark's score."""
    (result,) = ablations.run("table2", str(tmp_path), rows=["no_pretraining"], tasks=[key],
                              scale="paper", overrides=TINY).values()
    assert result["split"] == PAPER.report_split == "validation"
    metrics = result["metrics"]
    missing = _expected_metric_keys(key) - set(metrics)
    assert not missing, f"{key}: no {sorted(missing)} in {sorted(metrics)}"
    for task in plan.eval_tasks(key):
        assert metrics[f"{task}/checkpoint_step"] == 2.0
        assert any(k.startswith(task + "/") and not k.endswith("/checkpoint_step")
                   for k in metrics), task
    # a correlation over a tiny model's constant predictions is nan; nothing is missing
    assert all(isinstance(v, float) for v in metrics.values()), metrics


def test_multitask_mixtures_resolve_and_a_row_runs(paper_tfds, tmp_path):
    """Table 11 at paper scale: every paper mixture holds exactly its catalog members (each a
    registered task); one row trains on C4 + every benchmark (each member's train split, the
    mixture's validation split) and reports SQuAD from its best checkpoint (one benchmark's
    evaluation: GLUE's dozen tasks and their keys are test_paper_benchmark_finetunes_...'s)."""
    for spec in task_catalog.mixture_specs():
        if spec.paper:
            mixture = seqio.get_mixture_or_task(spec.name)
            assert sorted(t.name for t in mixture.tasks) == sorted(spec.members)
    (result,) = ablations.run("table11", str(tmp_path), rows=["k16"], tasks=["squad"],
                              scale="paper", overrides=TINY + [
                                  "pretrain.train.steps=1", "finetune.train.steps=1",
                                  "pretrain.checkpoint.every_steps=2"]).values()
    missing = _expected_metric_keys("squad") - set(result["metrics"])
    assert not missing, sorted(missing)


def test_paper_dry_run_names_real_tasks_and_splits(data_dir, capsys):
    """`t5lite ablate --table table2 --scale paper --dry-run`: every `t5lite eval` line names a
    registered task and a split that its TFDS builder generates (MNLI: its matched and
    mismatched tasks), and every `t5lite train` line a registered task or mixture."""
    ablations.run("table2", "/w", rows=["encdec_denoising"], scale="paper", dry_run=True)
    out = capsys.readouterr().out
    evals = re.findall(r"t5lite eval .*--task (\S+) --split (\S+)", out)
    assert {t for t, _ in evals} == {t for k in PAPER.tasks for t in plan.eval_tasks(k)}
    for task, split in evals:
        assert split == PAPER.report_split
        split_map = _split_map(task)
        assert split in split_map, f"{task} has no {split} split (only {sorted(split_map)})"
        tfds_name = seqio.get_mixture_or_task(task).source.tfds_dataset.name
        assert split_map[split] in tfds_fixtures.builder_splits(tfds_name), (task, split)
    assert ("paper_glue_mnli_matched", "validation") in evals
    assert ("paper_glue_mnli_mismatched", "validation") in evals
    assert "--task paper_glue_mnli " not in out
    for mixture in re.findall(r"--set data\.mixture_or_task=(\S+)", out):
        seqio.get_mixture_or_task(mixture)


def test_a_split_a_benchmark_lacks_is_refused_before_training(data_dir, tmp_path):
    """SQuAD (TFDS) has no test split: a scale that reports test refuses it at once."""
    from t5lite.errors import UserError
    with pytest.raises(UserError, match="paper_squad has no test split"):
        ablations.run("table2", str(tmp_path), rows=["no_pretraining"], tasks=["squad"],
                      scale="small")
    assert not list(tmp_path.iterdir())
