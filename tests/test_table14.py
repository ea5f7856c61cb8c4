"""T5's Table 14 (configs/ablations/table14.py): the final T5 sizes with the recipe of the
paper's Section 3.7. The paper's numbers are pinned in tests/test_paper_numbers.py."""

import pytest
import seqio

from t5lite import ablations, task_catalog
from t5lite.config import presets

SHAPE = ("d_model", "d_ff", "num_heads", "head_dim", "num_encoder_layers",
         "num_decoder_layers", "ffn", "tie_embeddings", "vocab_size", "position", "norm")
# t5/models/gin/models/bi_v1_small.gin, bi_bert_base.gin, bi_v1_large.gin, bi_v1_3B.gin,
# bi_v1_11B.gin: d_model, d_ff, heads, d_kv, layers per stack
GIN = {"small": (512, 2048, 8, 64, 6), "base": (768, 3072, 12, 64, 12),
       "large": (1024, 4096, 16, 64, 24), "3b": (1024, 16384, 32, 128, 24),
       "11b": (1024, 65536, 128, 128, 24)}
BEAMED = {"cnn_dailymail", "wmt_ende", "wmt_enfr", "wmt_enro"}


def _plan(row: str, scale: str = "paper", tasks=ablations.PAPER_TASKS):
    table = ablations.load_table("table14")
    return ablations.plan_row(table, table.row(row), "/w", tasks, scale)


@pytest.mark.parametrize("size", sorted(GIN))
def test_rows_are_t5_v1_0s_sizes_at_paper_scale(size):
    """Each row's pretraining and finetuning model is the t5_1_0_<size> preset's shape and T5's
    gin file's; at the tiny scale the same row is a toy of that shape."""
    pre, fts = _plan(size)
    want = {k: getattr(presets.t5_1_0(size).model, k) for k in SHAPE}
    for stage in [pre] + fts:
        assert {k: getattr(stage.cfg.model, k) for k in SHAPE} == want, stage.workdir
    m = pre.cfg.model
    assert (m.d_model, m.d_ff, m.num_heads, m.head_dim, m.num_encoder_layers) == GIN[size]
    tiny, _ = _plan(size, "tiny", ("sentiment",))
    assert tiny.cfg.model.d_model <= 192 and tiny.cfg.data.mixture_or_task == (
        f"multitask_t5_{size}")


def test_recipe_at_paper_scale():
    """1M steps of 2^11 x 512 on the size's multi-task mixture; finetuning continues it for
    2^18 steps, 8 sequences a batch and a checkpoint every 1,000 steps on GLUE / SuperGLUE,
    beam search (4, alpha 0.6) on WMT and CNN/DM only."""
    pre, fts = _plan("11b")
    assert pre.cfg.data.mixture_or_task == "paper_multitask_t5_11b"
    assert (pre.cfg.train.steps, pre.cfg.data.batch_size) == (2 ** 20, 2048)
    assert pre.cfg.data.feature_lengths["inputs"] == 512
    assert pre.cfg.model.dropout_rate == 0.1 and pre.cfg.optim.name == "adafactor"
    assert pre.cfg.optim.schedule == "rsqrt" and pre.cfg.optim.warmup_steps == 10000
    for ft in fts:
        glue = ft.task in ("glue", "super_glue")
        assert ft.cfg.data.batch_size == (8 if glue else 128), ft.task
        assert ft.cfg.checkpoint.every_steps == (1000 if glue else 5000), ft.task
        assert ft.cfg.decode.method == ("beam" if ft.task in BEAMED else "greedy"), ft.task
        assert (ft.cfg.decode.beams, ft.cfg.decode.alpha) == (4, 0.6)
        assert ft.start == 2 ** 20 and ft.cfg.train.steps == 2 ** 20 + 2 ** 18
        assert ft.cfg.checkpoint.init_state and ft.cfg.optim.learning_rate == 1e-3


def test_paper_mixture_counts_c4_at_the_papers_size_per_model(data_dir):
    """Span corruption on C4 at the artificial size of Section 3.7 (a fixed rate: no data is
    read for it), then every task the paper finetunes on."""
    for size, n in task_catalog.T5_FINAL_UNLABELED_SIZES.items():
        mix = seqio.get_mixture_or_task(f"paper_multitask_t5_{size}")
        names = [t.name for t in mix.tasks]
        assert names[0] == "c4_span_corruption" and "c4_iid_denoising" not in names
        assert set(names[1:]) == set(task_catalog.paper_multitask_members()[1:])
        assert mix.get_rate(mix.tasks[0]) == n
    assert task_catalog.T5_FINAL_UNLABELED_SIZES["11b"] == 133_000_000


def test_local_mixture_rates(data_dir):
    """The local mixture's rates: the corpus fixed at the size's count, each finetuning set
    min(N, 1M), both scaled by K_SCALE as Table 11's local mixtures."""
    mix = seqio.get_mixture_or_task("multitask_t5_small")
    scale = task_catalog.K_SCALE
    for task in mix.tasks:
        if task.name == "corpus_span_corruption":
            assert mix.get_rate(task) == int(710_000 * scale)
        else:
            n = task.num_input_examples("train")
            assert mix.get_rate(task) == min(n, int(1_000_000 * scale)), task.name
