"""The T5 paper's Tables 8 and 9 (configs/ablations/table8.py, table9.py): every row's
pretraining data at every scale, the data sets as TFDS really has them, the Wikipedia + TBC
row's stop before training without the user's books, and the first-N-tokens data (the same
whole set on every host and for every seed, repeated). Also Table 11's multi-task lengths,
`--scale paper` preparing no local data in any table, and Table 10's d = 2048 label."""

import os
import shlex

import pytest

from t5lite import ablations, task_catalog
from t5lite.errors import UserError

SMALL = ["model.d_model=32", "model.num_heads=2", "model.head_dim=16", "model.d_ff=64",
         "model.num_encoder_layers=1", "model.num_decoder_layers=1", "model.vocab_size=768",
         "train.prepare_data=()", "train.log_every=1"]
TFDS_NAMES = {"c4": "c4/en:3.1.0", "c4_noclean": "c4/en.noclean:3.1.0",
              "c4_realnewslike": "c4/realnewslike:3.1.0",
              "c4_webtextlike": "c4/webtextlike:3.1.0",
              "wikipedia": "wikipedia/20230601.en:1.0.0"}
VOCAB_FILES = {"tiny": "vocab/t5lite_sp8k.model", "small": "vocab/t5lite_sp8k.model",
               "paper": "vocab/t5_spiece.model"}


def _pretrain_plans(name, scale, overrides=()):
    table = ablations.load_table(name)
    return table, {r.name: ablations.plan_row(table, r, "/w", ("sentiment",), scale,
                                              overrides)[0] for r in table.rows}


def _dry_run(name, scale, capsys, **kw) -> str:
    ablations.run(name, "/w", scale=scale, dry_run=True, **kw)
    return capsys.readouterr().out


def _pretrain_sets(out: str, table: str, row: str) -> list:
    """The --set items of a dry run's pretraining command for ``row``."""
    line, = [ln for ln in out.splitlines() if f" --workdir /w/{table}/{row}/pretrain " in ln]
    words = shlex.split(line)
    return [words[i + 1] for i, w in enumerate(words) if w == "--set"]


def _vocab_file(task) -> str:
    return task.output_features["targets"].vocabulary._rel_path  # noqa: SLF001


# ----------------------------------------------------------------------------- Table 8


@pytest.mark.parametrize("scale", ["tiny", "small", "paper"])
def test_table8_rows_pretrain_on_their_data_set_at_every_scale(scale, capsys):
    """Each row reads its own TFDS set (or TBC's files) with the scale's vocabulary; the dry
    run prints exactly those tasks."""
    import seqio
    from t5lite.tasks import paper_data
    table, plans = _pretrain_plans("table8", scale)
    prefix = "" if scale == "paper" else "sp8k_"
    out = _dry_run("table8", scale, capsys, tasks=["glue"] if scale == "paper" else [])
    for row in table.rows:
        name = f"{prefix}{row.name}_iid_denoising"
        assert plans[row.name].cfg.data.mixture_or_task == name
        assert f"data.mixture_or_task={name}" in _pretrain_sets(out, "table8", row.name)
        provider = seqio.get_mixture_or_task(name)
        tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
        for task in tasks:
            assert _vocab_file(task) == VOCAB_FILES[scale]
            source = task.source
            if task.name.endswith("tbc_iid_denoising"):
                assert isinstance(source._split_to_filepattern, paper_data._TbcFiles)  # noqa
            else:
                data_set = task.name[len(prefix):-len("_iid_denoising")]
                assert source.tfds_dataset.name == TFDS_NAMES[data_set]
    mix = seqio.get_mixture_or_task(f"{prefix}wikipedia_tbc_iid_denoising")
    # mixed by the paper's sizes: 16GB of Wikipedia in the 20GB
    assert {t.name[len(prefix):]: mix.get_rate(t) for t in mix.tasks} == {
        "wikipedia_iid_denoising": 16.0, "tbc_iid_denoising": 4.0}
    assert all(plans[r].cfg.model.vocab_size == (32128 if scale == "paper" else 8192)
               for r in plans)


def test_table8_tfds_names_are_configs_and_versions_the_installed_tfds_has():
    """Every Table 8 set is a config of the installed TFDS builder at its version, and TFDS has
    no Toronto Books Corpus (the reason the TBC row reads the user's files)."""
    import tensorflow_datasets as tfds
    from t5lite.tasks import formats
    assert {k: formats.TFDS[k] for k in task_catalog.TFDS_DATA_SETS} == TFDS_NAMES
    for name in TFDS_NAMES.values():
        path, _, version = name.partition(":")
        builder, _, config = path.partition("/")
        cls = tfds.builder_cls(builder)
        configs = {c.name: c for c in cls.BUILDER_CONFIGS}
        assert config in configs, (name, sorted(configs)[:5])
        assert str(configs[config].version or cls.VERSION) == version
    assert not [n for n in tfds.list_builders(with_community_datasets=False)
                if "bookcorpus" in n.replace("_", "") or "toronto" in n]


def test_wikipedia_holds_out_its_last_percent_for_validation(tmp_path):
    """TFDS's Wikipedia has only a train split; the task's validation split is its last 1%,
    read from a real TFDS dataset written by the installed Wikipedia builder."""
    import seqio
    from test_formats import _tfds_fixture
    from t5lite.tasks import paper_data
    root = str(tmp_path / "tfds")
    pages = [{"title": f"Page {i}", "text": f"Page {i} is about topic {i}."} for i in range(200)]
    _tfds_fixture(root, "wikipedia", "20230601.en", "1.0.0", {"train": pages})
    seqio.set_tfds_data_dir_override(root)
    try:
        source = paper_data.tfds_source("wikipedia")
        seen = {s: [x["title"].decode() for x in source.get_dataset(s, shuffle=False)
                    .as_numpy_iterator()] for s in ("train", "validation")}
    finally:
        seqio.set_tfds_data_dir_override(None)
    assert (len(seen["train"]), len(seen["validation"])) == (198, 2)
    assert sorted(seen["train"] + seen["validation"]) == sorted(p["title"] for p in pages)


@pytest.fixture
def test_scale(monkeypatch):
    monkeypatch.setitem(ablations.SCALES, "test", ablations.Scale(
        pretrain=("train.steps=3", "checkpoint.every_steps=3", "train.eval_steps=0",
                  "data.batch_size=8", "data.feature_lengths={'inputs': 32, 'targets': 16}"),
        finetune=("train.steps=2", "checkpoint.every_steps=2", "train.eval_steps=0",
                  "data.batch_size=8")))
    return "test"


def test_tbc_row_stops_before_training_and_says_what_to_provide(data_dir, tmp_path,
                                                                test_scale):
    """Without the books the row stops with one line naming the files, before any training
    step (no checkpoint); with them the TBC task reads them."""
    import seqio
    wd = tmp_path / "abl"
    with pytest.raises(UserError) as err:
        ablations.run("table8", str(wd), rows=["wikipedia_tbc"], scale=test_scale,
                      overrides=SMALL)
    message = str(err.value)
    assert "\n" not in message and "Toronto Books Corpus" in message
    assert f"{data_dir}/tbc/train.txt" in message and f"{data_dir}/tbc/validation.txt" in message
    pre = wd / "table8" / "wikipedia_tbc" / "pretrain"
    assert not list(pre.glob("checkpoints/*")) and not (pre / "ablation_done.json").exists()
    os.makedirs(os.path.join(data_dir, "tbc"))
    try:
        for split in ("train", "validation"):
            with open(os.path.join(data_dir, "tbc", f"{split}.txt"), "w") as f:
                f.write("It was a dark and stormy night; the rain fell in torrents.\n" * 20)
        ds = seqio.get_mixture_or_task("sp8k_tbc_iid_denoising").get_dataset(
            {"inputs": 32, "targets": 16}, split="train", shuffle=False)
        ex = next(ds.as_numpy_iterator())
        assert len(ex["inputs"]) > 8 and len(ex["targets"]) > 1
    finally:
        for split in ("train", "validation"):
            os.remove(os.path.join(data_dir, "tbc", f"{split}.txt"))
        os.rmdir(os.path.join(data_dir, "tbc"))


# ----------------------------------------------------------------------------- Table 9


@pytest.mark.parametrize("scale,log2_sizes", [("tiny", (13, 11, 9, 7)),
                                              ("small", (15, 13, 11, 9)),
                                              ("paper", (29, 27, 25, 23))])
def test_table9_rows_keep_the_papers_repeats_at_every_scale(scale, log2_sizes, capsys):
    """Trained tokens / 2^k is the paper's repeat count (exactly at --scale paper, 2^35 /
    2^29 = 64 ...), at most twice it scaled down; the baseline reads the whole corpus."""
    import seqio
    table, plans = _pretrain_plans("table9", scale)
    base = "c4" if scale == "paper" else "corpus"
    assert plans["full"].cfg.data.mixture_or_task == f"{base}_iid_denoising"
    out = _dry_run("table9", scale, capsys, tasks=["glue"] if scale == "paper" else [])
    for row, k in zip(table.rows[1:], log2_sizes):
        cfg = plans[row.name].cfg
        name = f"{base}_iid_denoising_tokens2pow{k}"
        assert cfg.data.mixture_or_task == name
        assert f"data.mixture_or_task={name}" in _pretrain_sets(out, "table9", row.name)
        task = seqio.get_mixture_or_task(name)
        assert task.source.max_tokens == 2 ** k and _vocab_file(task) == VOCAB_FILES[scale]
        repeats = int(row.label[1].replace(",", ""))
        trained = cfg.train.steps * cfg.data.batch_size * cfg.data.feature_lengths["inputs"]
        assert repeats <= trained / 2 ** k < 2 * repeats
        if scale == "paper":
            assert trained == 2 ** 35 and trained // 2 ** k == repeats


def test_table9_row_follows_a_users_steps():
    _, plans = _pretrain_plans("table9", "tiny", ["pretrain.train.steps=600"])
    assert plans["tokens2pow29"].cfg.data.mixture_or_task == (
        "corpus_iid_denoising_tokens2pow15")  # 600 x 32 x 128 / 64 = 38,400 tokens
    _, plans = _pretrain_plans("table9", "tiny", ["pretrain.train.steps=1"])
    assert plans["tokens2pow23"].cfg.data.mixture_or_task == (
        f"corpus_iid_denoising_tokens2pow{task_catalog.FIRST_TOKENS_LOG2[0]}")


def _lines(ds):
    return [x.decode() for x in ds.as_numpy_iterator()]


def test_first_tokens_are_one_whole_set_on_every_host_and_seed(data_dir):
    """The first examples in file order until they hold 2^9 tokens; two hosts with their own
    shuffle seeds read disjoint halves of exactly that set; every epoch repeats it; the
    validation split stays whole."""
    import seqio
    task = seqio.get_mixture_or_task("corpus_iid_denoising_tokens2pow9")
    vocab = task.output_features["targets"].vocabulary
    kept = _lines(task.source.get_dataset("train", shuffle=False))
    with open(os.path.join(data_dir, "corpus", "train.txt")) as f:
        corpus = f.read().splitlines()
    assert kept == corpus[:len(kept)]
    sizes = [len(vocab.encode(line)) for line in kept]
    assert sum(sizes[:-1]) < 2 ** 9 <= sum(sizes)
    hosts = [_lines(task.source.get_dataset("train", shuffle=True, seed=seed,
                                            shard_info=seqio.ShardInfo(i, 2)))
             for i, seed in ((0, 1), (1, 2))]
    assert sorted(hosts[0] + hosts[1]) == sorted(kept) and not set(hosts[0]) & set(hosts[1])
    lengths = {"inputs": 32, "targets": 16}
    one = sum(1 for _ in task.get_dataset(lengths, "train", shuffle=True, seed=3))
    endless = task.get_dataset(lengths, "train", shuffle=True, seed=3, num_epochs=None)
    assert one > 0 and sum(1 for _ in endless.take(10 * one)) == 10 * one
    with open(os.path.join(data_dir, "corpus", "validation.txt")) as f:
        assert len(_lines(task.source.get_dataset("validation", shuffle=False))) == len(
            f.read().splitlines())


def test_first_tokens_of_c4_from_tfds(tmp_path):
    """--scale paper's source: C4's {"text": ...} examples in TFDS's stored order, cut before
    sharding (a real TFDS c4/en written by the installed builder)."""
    import seqio
    import tensorflow_datasets as tfds
    from test_formats import _tfds_fixture
    from t5lite.tasks import paper_data, vocabularies
    root = str(tmp_path / "tfds")
    docs = [{"text": f"Document {i} tells of the town and its weather.", "url": "u",
             "timestamp": "t", "content-type": "text/plain", "content-length": "9"}
            for i in range(60)]
    _tfds_fixture(root, "c4", "en", "3.1.0", {"train": docs, "validation": docs[:5]})
    vocab = vocabularies.get_vocabulary("t5lite_sp8k")
    seqio.set_tfds_data_dir_override(root)
    try:
        source = paper_data.FirstTokens(paper_data.tfds_source("c4"), 100, "t5lite_sp8k")
        kept = [x["text"] for x in source.get_dataset("train", shuffle=False)
                .as_numpy_iterator()]
        hosts = [[x["text"] for x in source.get_dataset(
            "train", seed=i, shard_info=seqio.ShardInfo(i, 3)).as_numpy_iterator()]
            for i in range(3)]
    finally:
        seqio.set_tfds_data_dir_override(None)
    stored = [x["text"] for x in tfds.load("c4/en:3.1.0", split="train", data_dir=root,
                                           shuffle_files=False).as_numpy_iterator()]
    assert kept == stored[:len(kept)] and 1 < len(kept) < len(stored)
    sizes = [len(vocab.encode(t.decode())) for t in kept]
    assert sum(sizes[:-1]) < 100 <= sum(sizes)
    assert sorted(sum(hosts, [])) == sorted(kept)


# ----------------------------------------------------------------------------- Tables 10, 11


def test_table11_multitask_keeps_each_tasks_finetuning_lengths():
    """One mixture, one length per feature: at paper scale 512 / 512, the finetuning lengths
    of every benchmark (CNN/DM's summaries are no longer cut to the denoising targets'
    length); the local scales keep theirs."""
    table = ablations.load_table("table11")
    for tasks in (ablations.PAPER_TASKS, ("squad",)):
        pre, fts = ablations.plan_row(table, table.row("k19"), "/w", tasks, "paper")
        assert pre.cfg.data.feature_lengths == {"inputs": 512, "targets": 512}
        for ft in fts:
            assert all(pre.cfg.data.feature_lengths[k] >= n
                       for k, n in ft.cfg.data.feature_lengths.items())
    pre, _ = ablations.plan_row(table, table.row("k19"), "/w", ("sentiment",), "tiny")
    # translate_en_de's targets: 96 (configs/finetune_translate_en_de.py says why)
    assert pre.cfg.data.feature_lengths == {"inputs": 128, "targets": 96}
    assert "translate_en_de" in pre.cfg.train.prepare_data  # the local sets, prepared
    pre, _ = ablations.plan_row(table, table.row("baseline"), "/w", ("squad",), "paper")
    assert pre.cfg.data.feature_lengths["targets"] < 512  # pretrain-then-finetune: unchanged


def test_paper_scale_prepares_no_local_data_in_any_table(capsys):
    """--scale paper reads C4 and the benchmarks from TFDS: no stage of any table prepares a
    local set (Table 11's rows did), and the dry run's commands say so. (Every paper
    benchmark's finetuning sets it the same way, paper._paper_task: one stands for all.)"""
    for name in ablations.table_names():
        table = ablations.load_table(name)
        for row in table.rows:
            pre, fts = ablations.plan_row(table, row, "/w", ("cnn_dailymail",), "paper")
            for stage in ([pre] if pre else []) + fts:
                assert stage.cfg.train.prepare_data == (), (name, row.name, stage.task)
    out = _dry_run("table11", "paper", capsys, rows=["k16", "equal"])
    assert "--set 'train.prepare_data=()'" in out and "corpus" not in out


def test_table10_d2048_label_names_table16():
    table = ablations.load_table("table10")
    assert "Table 16" in table.row("adapters2048").label[0]
    assert all("Table 16" not in r.label[0] for r in table.rows if r.name != "adapters2048")
