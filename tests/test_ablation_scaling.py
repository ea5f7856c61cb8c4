"""The T5 paper's Tables 12 and 13 (configs/ablations/table12.py, table13.py) and what they
need: finetuning that continues the pretraining run's step count and optimizer state (T5's
`finetune`, at --scale paper), the leave-one-out and supervised-only mixtures, and ensembles
decoded with the mean of their members' logits."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from t5lite.errors import UserError
from t5lite.store import checkpointing
from t5lite.train import trainer
from train_helpers import tf_iterator, tiny_config


def _losses(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


def _opt(workdir, step):
    import orbax.checkpoint as ocp
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(os.path.join(workdir, "checkpoints", str(step), "opt"))


def _pretrain_cfg(steps):
    cfg = tiny_config(optim="adafactor", lr=1e-2)
    cfg.train.steps, cfg.train.eval_steps = steps, 0
    cfg.checkpoint.every_steps, cfg.checkpoint.keep = 3, 0
    return cfg


def test_finetuning_continues_the_pretraining_step_and_optimizer_state(tmp_path):
    """checkpoint.init_state: the finetuning run's first step is the pretraining run's last
    + 1 and starts from its optimizer state, so one finetuning step on the batch the
    pretraining run would have seen next is that run's own next step, bit for bit."""
    pre_wd, more_wd = str(tmp_path / "pre"), str(tmp_path / "more")
    trainer.train(_pretrain_cfg(3), pre_wd, train_iter=tf_iterator(_pretrain_cfg(3)))
    # the pretraining run itself, one step further (its data iterator resumes at batch 3)
    shutil.copytree(pre_wd, more_wd)
    trainer.train(_pretrain_cfg(4), more_wd, train_iter=tf_iterator(_pretrain_cfg(4)),
                  allow_config_change=True)

    ft = _pretrain_cfg(4)  # train.steps counts the pretraining steps too
    ft.checkpoint.init_from, ft.checkpoint.init_state = pre_wd, True
    batches = tf_iterator(ft)
    for _ in range(3):  # the batch the pretraining run would see next
        next(batches)
    ft_wd = str(tmp_path / "ft")
    trainer.train(ft, ft_wd, train_iter=batches)
    assert sorted(_losses(ft_wd)) == [4]
    assert sorted(os.listdir(os.path.join(ft_wd, "checkpoints"))) == ["4"]
    assert int(_opt(ft_wd, 4)["step"]) == 4
    jax.tree.map(np.testing.assert_array_equal, _opt(ft_wd, 4), _opt(more_wd, 4))
    _, tuned = checkpointing.load_params(ft_wd)
    _, more = checkpointing.load_params(more_wd)
    jax.tree.map(np.testing.assert_array_equal, tuned, more)
    assert _losses(ft_wd)[4] == _losses(more_wd)[4]

    # steps that do not reach past the pretraining run's are a user error
    short = _pretrain_cfg(3)
    short.checkpoint.init_from, short.checkpoint.init_state = pre_wd, True
    with pytest.raises(UserError, match="must exceed the step"):
        trainer.train(short, str(tmp_path / "short"), train_iter=tf_iterator(short))


# ----------------------------------------------------------------------------- ensembles

N_NEW = 6


def _members(architecture, seeds=(1, 2)):
    import dataclasses
    import flax.linen as nn
    from t5lite import config as config_lib
    from t5lite.models import build_model, dummy_batch
    m = config_lib.ModelConfig(
        architecture=architecture, vocab_size=48, d_model=32, num_heads=2, head_dim=8, d_ff=48,
        num_encoder_layers=1, num_decoder_layers=2, dropout_rate=0.0, init_std=0.3)
    if architecture != "encoder_decoder":
        m = dataclasses.replace(m, position="learned", max_length=32)
    model = build_model(m)
    batch = dummy_batch(m, 1, {"inputs": 8, "targets": 8})
    return model, [nn.meta.unbox(model.init({"params": jax.random.key(s)}, batch)["params"])
                   for s in seeds]


def _mean_logits_greedy(model, members, inputs, lengths, eos_id):
    """By hand: argmax of the members' averaged logits, from full forward passes (no cache),
    one token at a time."""
    enc_dec = model.cfg.architecture == "encoder_decoder"
    b = inputs.shape[0]
    fwd = jax.jit(lambda p, x: model.apply({"params": p}, x, deterministic=True)["logits"])
    seq = np.zeros((b, N_NEW if enc_dec else inputs.shape[1] + N_NEW), np.int32)
    if not enc_dec:
        seq[:, :inputs.shape[1]] = inputs
    start = np.zeros(b, np.int32) if enc_dec else lengths - 1
    out, done = np.zeros((b, N_NEW), np.int32), np.zeros(b, bool)
    for i in range(N_NEW):
        if enc_dec:
            batch = {"encoder_input_tokens": inputs, "decoder_input_tokens": seq}
        else:
            batch = {"decoder_input_tokens": seq, "decoder_segment_ids": (
                np.arange(seq.shape[1])[None] < (lengths + i)[:, None]).astype(np.int32)}
        logits = np.mean([np.asarray(fwd(p, batch), np.float32) for p in members], axis=0)
        tok = np.where(done, 0, logits[np.arange(b), start + i].argmax(-1))
        out[:, i] = tok
        done |= tok == eos_id
        if enc_dec and i + 1 < N_NEW:
            seq[:, i + 1] = tok
        elif not enc_dec:
            seq[np.arange(b), lengths + i] = tok
    return out


@pytest.mark.parametrize("architecture", ["encoder_decoder"])
def test_ensemble_decoding_is_greedy_on_the_mean_of_the_members_logits(architecture):
    from t5lite import config as config_lib
    from t5lite.eval import decoding
    model, (a, b) = _members(architecture)
    rng = np.random.default_rng(0)
    lengths = np.array([9, 5, 3], np.int32)
    inputs = (rng.integers(2, 48, (3, 9)) * (np.arange(9) < lengths[:, None])).astype(np.int32)
    eos = 1
    dcfg = config_lib.DecodeConfig(max_length=N_NEW)
    one = decoding.generate(model, decoding.ensemble([a]), dcfg, inputs, lengths, eos_id=eos)
    alone = decoding.generate(model, a, dcfg, inputs, lengths, eos_id=eos)
    np.testing.assert_array_equal(one["tokens"], alone["tokens"])  # an ensemble of one
    np.testing.assert_allclose(one["scores"], alone["scores"], rtol=1e-5)
    two = decoding.generate(model, decoding.ensemble([a, b]), dcfg, inputs, lengths,
                            eos_id=eos)["tokens"]
    np.testing.assert_array_equal(two, _mean_logits_greedy(model, [a, b], inputs, lengths, eos))
    by_b = decoding.generate(model, b, dcfg, inputs, lengths, eos_id=eos)["tokens"]
    assert (two != alone["tokens"]).any() or (two != by_b).any(), "members agree: a weak test"
    with pytest.raises(UserError, match="decodes greedily"):
        decoding.generate(model, decoding.ensemble([a, b]),
                          config_lib.DecodeConfig(max_length=N_NEW, method="beam", beams=2),
                          inputs, lengths, eos_id=eos)


# ----------------------------------------------------------------------------- Tables 12, 13


def _plan(name, row, scale, tasks):
    from t5lite import ablations
    table = ablations.load_table(name)
    return ablations.plan_row(table, table.row(row), "/w", tasks, scale)


@pytest.mark.parametrize("scale,tasks,mixture", [
    ("tiny", ("sentiment", "translate_en_de"), "multitask_k19"),
    ("paper", ("glue", "squad"), "paper_multitask_k19")])
def test_table12_rows_pretrain_on_the_mixtures_then_finetune(scale, tasks, mixture):
    """Multi-task pretraining + finetuning, leave-one-out (one pretraining per task, on the
    mixture without it), supervised-only pretraining; the seqio mixtures hold what they say."""
    import seqio
    import t5lite.tasks  # noqa: F401  registers the mixtures
    from t5lite import task_catalog
    pre, fts = _plan("table12", "multitask_finetune", scale, tasks)
    assert pre.cfg.data.mixture_or_task == mixture
    assert all(ft.cfg.checkpoint.init_from == pre.workdir for ft in fts)
    # its targets are long enough for the finetuning tasks mixed into it
    assert pre.cfg.data.feature_lengths["targets"] >= max(
        ft.cfg.data.feature_lengths["targets"] for ft in fts)
    none, fts = _plan("table12", "leave_one_out", scale, tasks)
    assert none is None
    for ft in fts:
        src = ft.source
        assert src.workdir == f"/w/table12/leave_one_out/pretrain_without_{ft.task}"
        assert src.cfg.data.mixture_or_task == f"{mixture}_without_{ft.task}"
        assert ft.cfg.checkpoint.init_from == src.workdir
        kept = {t.name for t in seqio.get_mixture_or_task(src.cfg.data.mixture_or_task).tasks}
        full = {t.name for t in seqio.get_mixture_or_task(mixture).tasks}
        # all of the left-out downstream task's tasks (GLUE's nine), and only those
        prefix = task_catalog.PAPER_DOWNSTREAM_PREFIXES.get(ft.task, ft.task)
        assert full - kept == {t for t in full if t.startswith(prefix)} != set()
    sup, _ = _plan("table12", "supervised", scale, tasks)
    members = {t.name for t in seqio.get_mixture_or_task(sup.cfg.data.mixture_or_task).tasks}
    assert members == full - {"corpus_iid_denoising", "c4_iid_denoising"}
    multi, _ = _plan("table12", "multitask", scale, tasks)
    assert multi.cfg.data.mixture_or_task == mixture
    rate = seqio.get_mixture_or_task(mixture)._task_to_rate  # pylint: disable=protected-access
    k = 2 ** 19 if scale == "paper" else 2 ** 14
    assert all(r.keywords["maximum"] == k for r in rate.values())


def test_paper_scale_finetuning_continues_the_pretraining_run():
    """--scale paper: finetuning from step 2^19 with the pretraining run's optimizer state, to
    2^19 + 2^18 at a constant 1e-3; the tiny scale starts afresh; a leave-one-out finetuning
    continues its own pretraining; a multi-task row has no finetuning to continue."""
    pre, (ft,) = _plan("table12", "baseline", "paper", ("squad",))
    assert ft.cfg.checkpoint.init_state and ft.cfg.train.steps == 2 ** 19 + 2 ** 18
    assert (ft.cfg.optim.name, ft.cfg.optim.schedule, ft.cfg.optim.learning_rate,
            ft.cfg.optim.warmup_steps) == ("adafactor", "constant", 1e-3, 0)
    assert pre.cfg.optim.name == "adafactor"  # the same optimizer: its state carries over
    _, (tiny,) = _plan("table12", "baseline", "tiny", ("sentiment",))
    assert not tiny.cfg.checkpoint.init_state and tiny.cfg.train.steps == 150
    _, (loo,) = _plan("table12", "leave_one_out", "paper", ("squad",))
    assert loo.cfg.checkpoint.init_state and loo.cfg.train.steps == 2 ** 19 + 2 ** 18
    multi, _ = _plan("table12", "multitask", "paper", ("squad",))
    assert multi.cfg.train.steps == 2 ** 19 + 2 ** 18


def test_table13_sizes_steps_and_batch_at_paper_scale():
    """T5's 2x and 4x models (bi_v1_2x.gin / bi_v1_4x.gin: d_model 1024, d_ff 4096, 16
    heads, 16 / 32 layers per stack) and 4x steps or batch size, in both stages."""
    shapes = lambda c: (c.model.d_model, c.model.d_ff, c.model.num_heads, c.model.head_dim,  # noqa
                        c.model.num_encoder_layers, c.model.num_decoder_layers)
    base, (ft,) = _plan("table13", "baseline", "paper", ("glue",))
    assert shapes(base.cfg) == (768, 3072, 12, 64, 12, 12)
    pre, (ft,) = _plan("table13", "size2x_steps2x", "paper", ("glue",))
    assert shapes(pre.cfg) == shapes(ft.cfg) == (1024, 4096, 16, 64, 16, 16)
    assert pre.cfg.train.steps == 2 ** 20 and ft.cfg.train.steps == 2 ** 20 + 2 ** 19
    pre, (ft,) = _plan("table13", "size4x", "paper", ("glue",))
    assert shapes(pre.cfg) == shapes(ft.cfg) == (1024, 4096, 16, 64, 32, 32)
    assert pre.cfg.train.steps == 2 ** 19
    pre, (ft,) = _plan("table13", "steps4x", "paper", ("glue",))
    assert pre.cfg.train.steps == 2 ** 21 and ft.cfg.train.steps == 2 ** 21 + 2 ** 20
    pre, (ft,) = _plan("table13", "batch4x", "paper", ("glue",))
    assert pre.cfg.data.batch_size == ft.cfg.data.batch_size == 512
    # at tiny scale the same ratios of the tiny model
    pre, _ = _plan("table13", "size4x", "tiny", ("sentiment",))
    assert pre.cfg.model.num_encoder_layers > base.cfg.model.num_encoder_layers // 6


@pytest.mark.parametrize("scale", ["tiny", "paper"])
def test_table13_ensembles_train_members_and_evaluate_them_together(scale, capsys):
    from t5lite import ablations
    from t5lite.ablations import plan
    table = ablations.load_table("table13")
    tasks = ("sentiment",) if scale == "tiny" else ("squad",)
    shared, members = plan.plan_members(table, table.row("ensemble4x"), "/w", tasks, scale)
    assert shared is None and len(members) == 4
    seeds = []
    for m, (pre, (ft,)) in enumerate(members):
        assert pre.workdir == f"/w/table13/ensemble4x/member{m}/pretrain"
        assert ft.cfg.checkpoint.init_from == pre.workdir
        seeds.append((pre.cfg.train.seed, pre.cfg.data.seed, ft.cfg.train.seed))
    assert seeds == [(m, m, m) for m in range(4)]  # member 0 is the baseline's run
    shared, members = plan.plan_members(table, table.row("ensemble4x_finetune_only"), "/w",
                                        tasks, scale, seed=1)
    assert shared.workdir == "/w/table13/ensemble4x_finetune_only/seed1/pretrain"
    assert shared.cfg.train.seed == 1
    for m, (pre, (ft,)) in enumerate(members):
        assert pre is None and ft.cfg.checkpoint.init_from == shared.workdir
        assert ft.workdir == (f"/w/table13/ensemble4x_finetune_only/seed1/member{m}/"
                              f"finetune_{ft.task}")
        assert ft.cfg.train.seed == ft.cfg.data.seed == 4 + m
        assert ft.cfg.checkpoint.init_state == (scale == "paper")
    ablations.run(table, "/w", rows=["ensemble4x_finetune_only"], tasks=tasks, scale=scale,
                  dry_run=True)
    out = capsys.readouterr().out
    assert out.count("t5lite train") == 5 and out.count("# ensemble of 4") == 1
    for m in range(4):
        assert f"/w/table13/ensemble4x_finetune_only/member{m}/finetune_" in out
    got = ablations.estimate(table, rows=["ensemble4x", "ensemble4x_finetune_only"],
                             tasks=tasks, scale=scale)["rows"]
    pre, ft = (150, 150) if scale == "tiny" else (2 ** 19, 2 ** 18)  # steps trained
    assert got["ensemble4x"]["steps"] == 4 * (pre + ft)
    assert got["ensemble4x_finetune_only"]["steps"] == pre + 4 * ft


@pytest.mark.slow
def test_ensemble_row_end_to_end(data_dir, tmp_path, monkeypatch):
    """Table 13's fine-tune-only ensemble for a few steps of a small model: one pretraining,
    two finetunings, the ensemble tested on sentiment and recorded (--runslow; ~1 min)."""
    import dataclasses
    from t5lite import ablations
    from test_ablations import SMALL
    monkeypatch.setitem(ablations.SCALES, "test", ablations.Scale(
        pretrain=("train.steps=2", "checkpoint.every_steps=2", "train.eval_steps=0",
                  "data.batch_size=8", "data.feature_lengths={'inputs': 32, 'targets': 16}"),
        finetune=("train.steps=2", "checkpoint.every_steps=2", "eval.every_steps=2",
                  "train.eval_steps=0", "data.batch_size=8", "eval.max_examples=8")))
    table = ablations.load_table("table13")
    two = dataclasses.replace(table.row("ensemble4x_finetune_only"), ensemble=2)
    table = dataclasses.replace(table, rows=(table.row("baseline"), two))
    (result,) = ablations.run(table, str(tmp_path), rows=[two.name], scale="test",
                              overrides=SMALL).values()
    assert 0.0 <= result["metrics"]["sentiment/accuracy"] <= 100.0
    assert set(result["seconds"]) == {"pretrain", "member0/finetune_sentiment",
                                      "member1/finetune_sentiment"}
    row = tmp_path / "table13" / two.name
    assert (row / "ensemble_test_sentiment.json").exists()
    assert "4× ensembled, fine-tune only" in (tmp_path / "table13" / "table.md").read_text()
