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
from train_helpers import enable_compilation_cache, tf_iterator, tiny_config

CACHE = enable_compilation_cache()


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
