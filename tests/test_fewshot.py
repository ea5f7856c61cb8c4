"""In-context few-shot evaluation: seeded k-shot prompts without leakage of the scored example,
templates and label words, rank classification equal to make_score_fn's argmax, and
`t5lite eval --shots K` on a tiny checkpoint."""

import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest
import seqio

from t5lite import config as config_lib
from t5lite.errors import UserError
from t5lite.eval import decoding, evaluation, fewshot
from t5lite.models import build_model, dummy_batch

TRAIN = [(f"text number {i}", "positive" if i % 3 else "negative") for i in range(20)]
WORDS = {"negative": "negative", "positive": "positive"}


def test_shots_are_k_distinct_seeded_and_never_the_scored_example():
    a = fewshot.sample_shots(TRAIN, 4, seed=0, index=3, query=TRAIN[5][0])
    assert len(a) == len(set(a)) == 4 and 5 not in a
    assert a == fewshot.sample_shots(TRAIN, 4, seed=0, index=3, query=TRAIN[5][0])
    assert a != fewshot.sample_shots(TRAIN, 4, seed=1, index=3, query=TRAIN[5][0])
    assert a != fewshot.sample_shots(TRAIN, 4, seed=0, index=4, query=TRAIN[5][0])
    for i in range(20):  # even with every other row drawn, the query never is
        assert i not in fewshot.sample_shots(TRAIN, 19, seed=0, index=i, query=TRAIN[i][0])
    assert fewshot.sample_shots(TRAIN, 0, seed=0, index=0, query="x") == []
    with pytest.raises(UserError, match="only 19 usable"):
        fewshot.sample_shots(TRAIN, 20, seed=0, index=0, query=TRAIN[0][0])


def test_prompt_template_and_label_words():
    tmpl = fewshot.get_template("sentiment")
    shots = [TRAIN[1], TRAIN[3]]
    p = fewshot.build_prompt(tmpl, shots, "a new film", WORDS)
    assert p == ("Review: text number 1\nAnswer: positive\n\n"
                 "Review: text number 3\nAnswer: negative\n\nReview: a new film\nAnswer:")
    words = fewshot.parse_label_words("negative=terrible,positive=great", list(WORDS))
    assert words == {"negative": "terrible", "positive": "great"}
    q = fewshot.build_prompt(tmpl, shots, "a new film", words)
    assert q != p and "Answer: great" in q and "Answer: terrible" in q
    assert fewshot.build_prompt(fewshot.get_template("sentiment", "it_was"), shots[:1], "x",
                                words) == "text number 1 It was great\nx It was"
    literal = fewshot.get_template("sentiment", "Q: {input} A:")
    assert fewshot.build_prompt(literal, [], "x", words) == "Q: x A:"
    for bad in ("negative=bad,positive=bad", "neutral=meh", "positive"):
        with pytest.raises(UserError, match="label-words"):
            fewshot.parse_label_words(bad, list(WORDS))
    with pytest.raises(UserError, match="template"):
        fewshot.get_template("sentiment", "nope")


def _predictor(architecture, input_length=112):
    vocab = seqio.ByteVocabulary()
    m = config_lib.ModelConfig(
        architecture=architecture, vocab_size=vocab.vocab_size, d_model=32, num_heads=2,
        head_dim=8, d_ff=48, num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0,
        init_std=0.3)
    if architecture != "encoder_decoder":
        m = dataclasses.replace(m, position="learned", max_length=128)
    cfg = config_lib.Config(model=m)
    cfg.data.feature_lengths = {"inputs": input_length, "targets": 12}
    cfg.decode.max_length = 10
    cfg.eval.batch_size = 8
    model = build_model(m)
    params = nn.meta.unbox(model.init({"params": jax.random.key(0)},
                                      dummy_batch(m, 1, {"inputs": 8, "targets": 8}))["params"])
    return evaluation.Predictor(cfg, model, params, vocab.eos_id), vocab


@pytest.mark.parametrize("architecture", ["decoder_only", "encoder_decoder"])
def test_rank_classification_picks_the_highest_log_likelihood(architecture):
    pred, vocab = _predictor(architecture)
    examples = TRAIN[:5]
    words = {"negative": "no", "positive": "yes"}
    tmpl = fewshot.get_template("sentiment", "input_answer")
    out = fewshot.evaluate_fewshot(pred, vocab, vocab, "toy", TRAIN, examples, 2, tmpl, words,
                                   "rank", seed=3)
    # the same prompts scored directly with decoding.make_score_fn
    score = decoding.make_score_fn(pred.model)
    eos = vocab.eos_id
    want = []
    for i, (x, _) in enumerate(examples):
        shots = [TRAIN[j] for j in fewshot.sample_shots(TRAIN, 2, 3, i, x)]
        ids = list(vocab.encode(fewshot.build_prompt(tmpl, shots, x, words)))
        enc = architecture == "encoder_decoder"
        ids = ids + [eos] if enc else ids
        answers = [list(vocab.encode(" " + w)) + ([eos] if enc else []) for w in words.values()]
        batch = evaluation.score_batch(architecture, [ids] * 2, answers, len(ids),
                                       max(map(len, answers)))
        lls = np.asarray(score(pred.params, batch))
        assert abs(lls[0] - lls[1]) > 1e-4  # a real choice
        want.append(list(words)[int(np.argmax(lls))])
    assert out["predictions"] == want
    gold = [y for _, y in examples]
    assert out["toy/accuracy"] == 100.0 * np.mean([w == g for w, g in zip(want, gold)])
    assert out["toy/truncated_prompts"] == 0
    gen = fewshot.evaluate_fewshot(pred, vocab, vocab, "toy", TRAIN, examples, 1, tmpl, words,
                                   "generate")
    assert len(gen["predictions"]) == 5 and 0 <= gen["toy/accuracy"] <= 100


def test_long_prompts_keep_the_query():
    pred, vocab = _predictor("decoder_only", input_length=40)
    tmpl = fewshot.get_template("sentiment", "input_answer")
    out = fewshot.evaluate_fewshot(pred, vocab, vocab, "toy", TRAIN, TRAIN[:3], 4, tmpl, WORDS,
                                   "rank")
    assert out["toy/truncated_prompts"] == 3


def test_eval_shots_command_on_a_tiny_gpt(data_dir, tmp_path, capsys):
    from t5lite.cli import main as cli
    from t5lite.train import trainer
    cfg = config_lib.Config(name="tiny_fewshot")
    m = cfg.model
    m.architecture, m.position, m.max_length = "decoder_only", "learned", 96
    m.vocab_size, m.d_model, m.num_heads, m.head_dim, m.d_ff = 768, 32, 2, 16, 64
    m.num_decoder_layers, m.dropout_rate = 1, 0.0
    cfg.data.mixture_or_task, cfg.data.pack = "sentiment", False
    cfg.data.feature_lengths = {"inputs": 24, "targets": 4}
    cfg.data.batch_size = 8
    cfg.optim.name, cfg.optim.schedule, cfg.optim.warmup_steps = "adamw", "constant", 0
    cfg.train.steps, cfg.train.eval_steps, cfg.checkpoint.every_steps = 2, 1, 2
    wd = str(tmp_path / "gpt")
    trainer.train(cfg, wd)
    capsys.readouterr()
    base = ["eval", "--checkpoint", wd, "--task", "sentiment", "--max-examples", "6"]
    assert cli.main(base + ["--shots", "2", "--context-length", "80"]) == 0
    out = capsys.readouterr().out
    assert "sentiment/accuracy" in out and "2-shot" in out and "context=80" in out
    assert cli.main(base + ["--shots", "1", "--label-words", "positive=great,negative=awful",
                            "--scoring", "generate"]) == 0
    assert "'positive': 'great'" in capsys.readouterr().out
    assert cli.main(base + ["--shots", "1", "--template", "bad"]) == 2
