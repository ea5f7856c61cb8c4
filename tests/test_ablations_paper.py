"""The ablation tables at the paper's scale: steps, vocabulary, lengths and splits as T5 ran
them, Table 11's steps and K, the LM and no-pretraining rows, Table 10's adapters, BLEU's
tokenization, seeds, and the estimate of steps, tokens and compiled slices."""

import numpy as np
import pytest

from t5lite import ablations
from t5lite.cli import main as cli
from t5lite.errors import UserError
from test_ablations import _plans


# ----------------------------------------------------------------------------- the paper's setup


def test_paper_scale_steps_vocabulary_lengths_and_split(capsys):
    """Items 1, 7, 8, 9: 2^19 pretraining + 2^18 finetuning steps, the t5 vocabulary and C4,
    128 packed 512-token finetuning sequences, validation numbers from every checkpoint."""
    import seqio
    table, plans = _plans("table6", "paper", tasks=("glue", "squad"))
    pre, (glue, squad) = plans["rate10"]
    # finetuning continues the pretraining run (T5's finetune): 2^18 steps more
    assert pre.cfg.train.steps == 2 ** 19 and glue.cfg.train.steps == 2 ** 19 + 2 ** 18
    assert glue.cfg.checkpoint.init_state and glue.cfg.optim.schedule == "constant"
    assert pre.cfg.data.mixture_or_task == "c4_iid_denoising_rate10"
    task = seqio.get_mixture_or_task(pre.cfg.data.mixture_or_task)
    vocab = task.output_features["targets"].vocabulary
    assert vocab._rel_path == "vocab/t5_spiece.model" and vocab.extra_ids == 100  # noqa: SLF001
    assert pre.cfg.model.vocab_size == 32128
    assert isinstance(task.source, seqio.TfdsDataSource) and task.source.tfds_dataset.name == (
        "c4/en:3.1.0")
    for ft in (glue, squad):
        assert ft.cfg.data.feature_lengths == {"inputs": 512, "targets": 512}
        assert ft.cfg.data.pack and ft.cfg.data.batch_size == 128
        assert ft.cfg.checkpoint.every_steps == 5000 and ft.cfg.checkpoint.keep >= 2 ** 18 // 5000
    assert squad.cfg.data.mixture_or_task == "paper_squad"
    assert ablations.SCALES["paper"].report_split == "validation"
    ablations.run("table6", "/w", rows=["rate10"], tasks=["squad"], scale="paper", dry_run=True)
    out = capsys.readouterr().out
    assert ("t5lite eval --checkpoint /w/table6/rate10/finetune_squad/checkpoints/STEP --task "
            "paper_squad --split validation") in out
    # the default tasks at paper scale are the paper's seven benchmarks
    ablations.run("table6", "/w", rows=["rate10"], scale="paper", dry_run=True)
    out = capsys.readouterr().out
    for key in ablations.PAPER_TASKS:
        assert f"/w/table6/rate10/finetune_{key} " in out
    for member in ("paper_super_glue_record", "paper_super_glue_wsc", "paper_glue_cola"):
        assert f"--task {member} --split validation" in out


def test_table11_paper_scale_steps_and_k():
    """Items 2, 3: 2^19 + 2^18 multi-task steps; the paper's K (not scaled) at paper scale,
    so k16 caps at 65,536 examples and differs from equal; every checkpoint kept."""
    import seqio
    _, plans = _plans("table11", "paper", tasks=("glue",))
    for name in ("k16", "k21", "t2", "equal"):
        pre, _ = plans[name]
        assert pre.cfg.train.steps == 2 ** 19 + 2 ** 18
        assert pre.cfg.checkpoint.keep >= pre.cfg.train.steps // pre.cfg.checkpoint.every_steps
        assert pre.cfg.data.mixture_or_task.startswith("paper_multitask_")
    for name, k in (("k16", 2 ** 16), ("k21", 2 ** 21)):
        mix = seqio.get_mixture_or_task(plans[name][0].cfg.data.mixture_or_task)
        rates = {t.name: mix._task_to_rate[t.name]  # pylint: disable=protected-access
                 for t in mix.tasks}
        assert all(r.keywords["maximum"] == k for r in rates.values())
        assert {"c4_iid_denoising", "paper_squad", "paper_glue_mnli"} <= set(rates)
    equal = seqio.get_mixture_or_task(plans["equal"][0].cfg.data.mixture_or_task)
    assert all(equal.get_rate(t) == 1.0 for t in equal.tasks)
    # local scales keep the scaled K
    _, plans = _plans("table11", "tiny")
    assert plans["k16"][0].cfg.data.mixture_or_task == "multitask_k16"


def test_table2_lm_denoising_and_no_pretraining_rows():
    """Item 10: the decoder-only LM x denoising row trains on inputs EOS targets as one
    sequence (loss on all of it, the reference's delimited LM); Table 1's control row."""
    _, plans = _plans("table2")
    pre, _ = plans["lm_denoising"]
    assert pre.cfg.data.mixture_or_task == "corpus_iid_denoising_lm"
    assert pre.cfg.data.feature_lengths == {"targets": 128 + ablations.iid_targets(128, 0.15)}
    assert plans["prefixlm_denoising"][0].cfg.data.mixture_or_task == "corpus_iid_denoising"
    pre, (ft,) = plans["no_pretraining"]
    assert pre is None and ft.cfg.checkpoint.init_from == ""
    table = ablations.load_table("table2")
    assert table.row("no_pretraining").paper == ablations.PAPER_NO_PRETRAINING


def test_table10_adapters_are_dense_relu_dense_after_the_mlp_only():
    """Item 6: one adapter per block, after the feed-forward sub-layer, with its own norm and
    residual; no biases; identity at init; x + wo(relu(wi(norm(x))))."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    from flax import traverse_util
    from t5lite import peft
    from t5lite.peft import build_model
    table, plans = _plans("table10")
    _, (ft,) = plans["adapters32"]
    cfg = ft.cfg.model
    model = build_model(cfg)
    batch = {"encoder_input_tokens": jnp.ones((1, 8), jnp.int32),
             "decoder_input_tokens": jnp.ones((1, 4), jnp.int32)}
    params = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), batch)))[
        "params"]
    paths = ["/".join(k) for k in traverse_util.flatten_dict(params)]
    adapters = sorted({p.split("/mlp_adapter/")[1] for p in paths if "_adapter/" in p})
    assert adapters == ["layer_norm/scale", "wi/kernel", "wo/kernel"]
    assert all("/layers/mlp_adapter/" in p for p in paths if "_adapter/" in p)
    assert {p.split("/")[0] for p in paths if "mlp_adapter" in p} == {"encoder", "decoder"}
    a = peft.Adapter(cfg)
    x = jax.random.normal(jax.random.key(1), (2, 3, cfg.d_model))
    v = nn.meta.unbox(a.init(jax.random.key(2), x))
    np.testing.assert_allclose(a.apply(v, x), x)  # wo = 0: the identity at init
    wo = jax.random.normal(jax.random.key(3), v["params"]["wo"]["kernel"].shape)
    v = {"params": {**v["params"], "wo": {"kernel": wo}}}
    p = v["params"]
    h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + cfg.norm_eps)
    h = h * p["layer_norm"]["scale"]
    want = x + jnp.maximum(h @ p["wi"]["kernel"], 0) @ wo
    np.testing.assert_allclose(a.apply(v, x), want, rtol=2e-2, atol=2e-2)


def test_bleu_is_t5s_intl_tokenization():
    import sacrebleu
    from t5lite.tasks import metrics
    refs = ["Der Preis beträgt 3,50 € – sagte er.", "Das ist „gut“, nicht schlecht."]
    preds = ["Der Preis beträgt 3,50€ – sagte er .", "Das ist „gut“ , nicht schlecht ."]
    got = metrics.bleu(refs, preds)["bleu"]
    assert got == pytest.approx(sacrebleu.corpus_bleu(preds, [refs], tokenize="intl").score)
    assert got != pytest.approx(sacrebleu.corpus_bleu(preds, [refs]).score)


def test_seeds_run_each_row_n_times(capsys):
    ablations.run("table6", "/w", rows=["rate10"], seeds=3, dry_run=True)
    out = capsys.readouterr().out
    assert "--workdir /w/table6/rate10/pretrain " in out
    for k in (1, 2):
        assert f"--workdir /w/table6/rate10/seed{k}/pretrain " in out
        assert f"--set train.seed={k} --set data.seed={k}" in out
    with pytest.raises(UserError, match="seeds"):
        ablations.run("table6", "/w", seeds=0, dry_run=True)
    assert cli.main(["ablate", "--table", "6", "--workdir", "/w", "--rows", "rate10",
                     "--seeds", "2", "--dry-run"]) == 0


def test_estimate_steps_and_tokens(capsys):
    got = ablations.estimate("table6", rows=["rate15"], tasks=["glue"], scale="paper")
    pre_tokens = 2 ** 19 * 128 * (512 + ablations.iid_targets(512, 0.15))
    ft_tokens = 2 ** 18 * 128 * (512 + 512)
    assert got["rows"]["rate15"] == {"steps": 2 ** 19 + 2 ** 18,
                                     "tokens": pre_tokens + ft_tokens}
    got = ablations.estimate("table11", rows=["k16", "baseline"], tasks=["glue"],
                             scale="paper", seeds=2)
    assert got["rows"]["k16"]["steps"] == 2 * (2 ** 19 + 2 ** 18)  # no finetuning stage
    assert got["total"]["steps"] == 4 * (2 ** 19 + 2 ** 18)
    out = capsys.readouterr().out
    assert "k16 | 1,572,864 |" in out and "total | 3,145,728 |" in out
    assert cli.main(["ablate", "--table", "2", "--estimate", "--rows", "no_pretraining"]) == 0
    # paper scale by default: 2^18 finetuning steps on each of the seven benchmarks
    assert "no_pretraining | 1,835,008 |" in capsys.readouterr().out


@pytest.mark.slow
def test_estimate_topology_compiles_each_row_for_the_slice(capsys):
    """TPU-hours = steps x `t5lite compile`'s expected_step_seconds x chips (a real AOT
    compile of the tiny row for a 4-chip v5e slice; needs libtpu, as the test extra
    installs)."""
    got = ablations.estimate("table2", rows=["encdec_denoising"], scale="tiny",
                             topology="v5litepod-4")
    row = got["rows"]["encdec_denoising"]
    assert row["steps"] == got["total"]["steps"] > 0
    assert 0 < row["tpu_hours"] == got["total"]["tpu_hours"] < 1  # a tiny model: seconds
    out = capsys.readouterr().out
    assert "on v5litepod-4" in out and "TPU-hours" in out and "| 0.0 " not in out
