"""`t5lite data cache`: seqio's Beam caching pipeline (tasks/beam_cache.py), its dry run, and the
TFDS data dir (data.tfds_data_dir) the TFDS-backed tasks read."""

import json
import os

import numpy as np
import pytest
import seqio

import tfds_fixtures
from t5lite import config as config_lib
from t5lite.errors import UserError


def _canon(ex) -> tuple:
    """An example as a hashable row: its features in name order, provenance left out."""
    return tuple((k, tuple(np.asarray(v).ravel().tolist())) for k, v in sorted(ex.items())
                 if not k.startswith("provenance/"))


def _uncached(task, split):
    ds = task.preprocess_precache(task.source.get_dataset(split=split, shuffle=False))
    return [_canon(ex) for ex in ds.as_numpy_iterator()]


def _cached(task, split):
    ds = task._get_cached_source(split).get_dataset(split=split, shuffle=False)
    return [_canon(ex) for ex in ds.as_numpy_iterator()]


def _rows(batches):
    keys = sorted(batches[0])
    return [tuple(np.concatenate([np.asarray(b[k])[i] for k in keys]).tolist())
            for b in batches for i in range(len(b[keys[0]]))]


def test_beam_cache_holds_the_uncached_examples(data_dir, tmp_path, capsys):
    """seqio's Beam pipeline on the DirectRunner caches every split of a tokenized task and of
    a span-corruption task: the same examples, features and dtypes as preprocessing on the fly
    (seqio's pipeline shuffles them globally, so as a multiset), info and stats as seqio
    writes them; data.use_cached=true then trains from exactly those examples, reproducibly."""
    pytest.importorskip("apache_beam", reason="seqio's Beam pipeline: pip install -e '.[beam]'")
    from t5lite.cli import main as cli
    from t5lite.tasks import pipeline
    from t5lite.train import trainer
    cache_dir = str(tmp_path / "cache")
    names = ["sentiment", "corpus_span_corruption"]
    assert cli.main(["data", "cache", *names, "--cache-dir", cache_dir,
                     "--runner", "DirectRunner"]) == 0
    assert sorted(os.listdir(cache_dir)) == sorted(names)  # the staging dir is gone
    for name in names:
        task = seqio.get_mixture_or_task(name)
        task_dir = os.path.join(cache_dir, name)
        assert task.cache_dir == task_dir
        for split in task.splits:
            fresh, cached = _uncached(task, split), _cached(task, split)
            assert len(cached) == len(fresh) > 0
            assert sorted(cached) == sorted(fresh)
            with open(os.path.join(task_dir, f"info.{split}.json")) as f:
                info = json.load(f)
            spec = task.preprocess_precache(task.source.get_dataset(split=split)).element_spec
            assert {k: v["dtype"] for k, v in info["features"].items()} == {
                k: s.dtype.name for k, s in spec.items() if not k.startswith("provenance/")}
            assert task.get_cached_stats(split)["examples"] == len(fresh)
    assert "corpus_span_corruption validation: " in capsys.readouterr().out

    cfg = config_lib.Config()
    cfg.data.mixture_or_task, cfg.data.feature_lengths = "sentiment", {"inputs": 24,
                                                                     "targets": 4}
    cfg.data.batch_size, cfg.data.pack = 2, False
    cfg.data.use_cached, cfg.data.cache_dir = True, cache_dir
    first = list(trainer.dataset_iterator(cfg, "validation", shuffle=False, num_epochs=1))
    again = list(trainer.dataset_iterator(cfg, "validation", shuffle=False, num_epochs=1))
    fresh = list(pipeline.get_dataset("sentiment", cfg.data.feature_lengths, "encoder_decoder",
                                      2, split="validation", shuffle=False, pack=False,
                                      num_epochs=1).as_numpy_iterator())
    assert _rows(first) == _rows(again)  # a given cache always gives the same batches
    assert sorted(_rows(first)) == sorted(_rows(fresh))


def test_dry_run_prints_the_pipeline_options_and_writes_nothing(data_dir, tmp_path, capsys):
    """--dry-run names the tasks to cache and the options a Dataflow job would be given (as
    Beam parses them where apache-beam is installed); nothing is written, nothing runs. A task
    already cached is left alone unless --force."""
    from t5lite.cli import main as cli
    cache_dir = str(tmp_path / "cache")
    opts = ["--project=my-proj", "--region=us-central1", "--temp_location=gs://b/tmp"]
    assert cli.main(["data", "cache", "sentiment", "--cache-dir", cache_dir, "--dry-run",
                     "--runner", "DataflowRunner", "--pipeline-options", *opts]) == 0
    out = capsys.readouterr().out
    assert f"would cache sentiment into {cache_dir}" in out
    for opt in ["--runner=DataflowRunner"] + opts:
        assert f"  {opt}\n" in out
    assert not os.path.exists(cache_dir)
    os.makedirs(os.path.join(cache_dir, "sentiment"))
    open(os.path.join(cache_dir, "sentiment", "COMPLETED"), "w").close()
    assert cli.main(["data", "cache", "sentiment", "--cache-dir", cache_dir, "--dry-run"]) == 0
    assert "would cache nothing" in capsys.readouterr().out
    assert cli.main(["data", "cache", "sentiment", "--splits", "train", "--cache-dir",
                     cache_dir, "--runner", "DirectRunner"]) != 0
    assert "--splits needs --runner local" in capsys.readouterr().err


@pytest.fixture
def c4_tfds(data_dir, tmp_path):
    """C4 (c4/en:3.1.0) as a strict TFDS fixture, the `--scale paper` tasks registered over it
    with the test vocabulary (fresh TFDS loaders, the t5 one restored afterwards)."""
    from t5lite.tasks import ablation_tasks
    root = tfds_fixtures.write_all(str(tmp_path / "tfds"), ["c4/en:3.1.0"])
    ablation_tasks.register_paper("t5lite_sp8k")
    yield root
    seqio.set_tfds_data_dir_override(None)
    ablation_tasks.register_paper("t5")


def test_tfds_data_dir_setting_reaches_the_tfds_tasks(c4_tfds):
    """data.tfds_data_dir is where a TFDS-backed task reads (set once by the entry points that
    build data: train, eval, data cache): a local dir trains from its C4, a gs:// URL is what
    the task's TFDS loader is pointed at (not read here: TensorFlow's GCS filesystem, which
    TFDS reads gs:// through, has no emulator endpoint)."""
    from t5lite.tasks import ablation_tasks, pipeline, tfds_dir
    from t5lite.train import data as train_data
    cfg = config_lib.Config()
    cfg.data.mixture_or_task = "c4_span_corruption"
    cfg.data.tfds_data_dir = c4_tfds
    cfg.model.vocab_size = 8192
    cfg.data.paper_vocabulary = "t5lite_sp8k"  # as the fixture registered them
    train_data.prepare_tasks(cfg)
    batch = next(pipeline.get_dataset("c4_span_corruption", {"inputs": 32, "targets": 8},
                                      "encoder_decoder", 2, pack=False).as_numpy_iterator())
    assert np.asarray(batch["encoder_input_tokens"]).any()
    ablation_tasks.register_paper("t5lite_sp8k")  # fresh loaders: seqio keeps the first dir
    cfg.data.tfds_data_dir = "gs://my-bucket/tensorflow_datasets/"
    train_data.prepare_tasks(cfg)
    loader = seqio.get_mixture_or_task("c4_span_corruption").source.tfds_dataset
    assert loader.data_dir == "gs://my-bucket/tensorflow_datasets"
    with pytest.raises(UserError, match="local path or a gs:// URL"):
        tfds_dir.use_tfds_data_dir("s3://bucket/tfds")


def test_an_unfinished_beam_job_leaves_the_earlier_cache_alone(data_dir, tmp_path):
    """A task's staged output without COMPLETED (a failed or cancelled job) is not moved over
    the cache that was there; a completed one replaces it."""
    from t5lite.tasks import beam_cache
    task = seqio.get_mixture_or_task("sentiment")
    root, staging = tmp_path / "cache", tmp_path / "cache" / beam_cache.STAGING
    (root / "sentiment").mkdir(parents=True)
    (root / "sentiment" / "COMPLETED").write_text("")
    (root / "sentiment" / "train.tfrecord-00000-of-00001").write_text("earlier")
    (staging / "sentiment").mkdir(parents=True)
    (staging / "sentiment" / "train.tfrecord-00000-of-00001").write_text("partial")
    with pytest.raises(UserError, match="no COMPLETED file for 'sentiment'"):
        beam_cache._move_into_place(str(staging), str(root), task)
    assert (root / "sentiment" / "train.tfrecord-00000-of-00001").read_text() == "earlier"
    (staging / "sentiment" / "COMPLETED").write_text("")
    assert beam_cache._move_into_place(str(staging), str(root), task) == str(root / "sentiment")
    assert (root / "sentiment" / "train.tfrecord-00000-of-00001").read_text() == "partial"
    assert not (staging / "sentiment").exists()
