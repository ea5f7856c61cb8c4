"""RoBERTa: HF RobertaForMaskedLM <-> t5lite (BERT layers, positions offset by padding_idx + 1),
logits parity on a random tiny model, export round trip, and the roberta_base preset."""

import numpy as np
import torch
import transformers

import hf_fixtures as F
from t5lite import convert
from t5lite.models import build_model


def _hf_roberta(seed=3):
    cfg = transformers.RobertaConfig(
        vocab_size=F.VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=24 + 2, type_vocab_size=1,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-5,
        pad_token_id=1, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(seed)
    model = transformers.RobertaForMaskedLM(cfg)
    F.randomize_(model, seed)
    with torch.no_grad():  # the LM head's own bias (not named *predictions.bias)
        model.lm_head.bias.copy_(0.1 * torch.randn(model.lm_head.bias.shape))
    return model.eval()


def _batch(rng, batch=3, length=11):
    mask = F._mask(F.padded_lengths(batch, length, rng), length)
    tokens = F._tokens(rng, mask)  # real ids >= 2: never t5lite's pad 0 nor RoBERTa's pad 1
    hf_ids = np.where(mask == 1, tokens, 1)
    hf = dict(input_ids=torch.tensor(hf_ids, dtype=torch.long),
              attention_mask=torch.tensor(mask, dtype=torch.long))
    ours = dict(encoder_input_tokens=tokens, encoder_segment_ids=mask,
                encoder_positions=F._positions(mask))
    return hf, ours, mask.astype(bool)


def _ours(cfg, params, batch):
    model = build_model(cfg.model)
    return np.asarray(model.apply({"params": params}, batch, deterministic=True)["logits"])


def test_roberta_logits_match_hf_and_export_round_trips(tmp_path):
    hf_model = _hf_roberta()
    hf_dir = F.save_hf_model(hf_model, tmp_path / "hf")
    cfg, params = convert.hf_to_t5lite(hf_dir)
    m = cfg.model
    assert (m.architecture, m.max_length, m.hf_class) == ("encoder_only", 24,
                                                          "RobertaForMaskedLM")
    assert not m.nsp_head and not m.pooler and m.num_token_types == 1
    hf_batch, batch, real = _batch(np.random.default_rng(7))
    with torch.no_grad():
        ref = hf_model(**hf_batch).logits.numpy()
    diff = float(np.abs(_ours(cfg, params, batch) - ref)[real].max())
    assert diff <= F.PARITY_TOL, diff
    # the offset matters: positions read from HF row p instead of p + 2 move the logits
    pos = np.asarray(params["encoder"]["position_embedder"]["embedding"])
    hf_pos = hf_model.roberta.embeddings.position_embeddings.weight.detach().numpy()
    np.testing.assert_array_equal(pos, hf_pos[2:])
    params["encoder"]["position_embedder"]["embedding"] = hf_pos[:-2]
    assert np.abs(_ours(cfg, params, batch) - ref)[real].max() > 100 * F.PARITY_TOL
    params["encoder"]["position_embedder"]["embedding"] = pos
    # export: transformers loads it back as RobertaForMaskedLM with the same logits
    out = convert.t5lite_to_hf(cfg, params, str(tmp_path / "out"))
    back = transformers.AutoModelForMaskedLM.from_pretrained(out, attn_implementation="eager")
    assert type(back).__name__ == "RobertaForMaskedLM"
    with torch.no_grad():
        again = back.eval()(**hf_batch).logits.numpy()
    assert np.abs(again - ref)[real].max() <= F.PARITY_TOL
    cfg2, params2 = convert.hf_to_t5lite(out)
    assert cfg2.model == cfg.model
    np.testing.assert_array_equal(params2["encoder"]["position_embedder"]["embedding"], pos)


def test_roberta_base_preset():
    from t5lite.config import load_config
    from t5lite.models import count_params
    cfg = load_config("roberta_base")
    m = cfg.model
    assert (m.hf_class, m.nsp_head, m.pooler, m.max_length) == ("RobertaForMaskedLM", False,
                                                               False, 512)
    assert cfg.data.pack and "mlm_only" in cfg.data.mixture_or_task  # no NSP, packed rows
    hf = convert.config_to_hf(m)
    assert hf["max_position_embeddings"] == 514 and hf["type_vocab_size"] == 1
    # RoBERTa-base has 124.6M parameters with its 50265-token vocabulary and MLM head
    assert abs(count_params(m) - 124.6e6) < 0.2e6


def test_mlm_data_is_drawn_again_every_epoch(data_dir):
    """RoBERTa's dynamic masking: the MLM task's stateless seeds differ per repetition, so a
    second epoch over the same split repeats no masked row of the first (static masking, as
    in the original BERT data generation, would repeat all of them)."""
    from t5lite.tasks import pipeline

    def rows(epochs):
        ds = pipeline.get_dataset("corpus_mlm_only", {"inputs": 32}, "encoder_only", 8,
                                  split="validation", shuffle=False, seed=0, pack=False,
                                  num_epochs=epochs, drop_remainder=False)
        return [(x.tobytes(), w.tobytes()) for b in ds.as_numpy_iterator()
                for x, w in zip(b["encoder_input_tokens"], b["encoder_loss_weights"])]
    first = rows(1)
    both = rows(2)
    # the same seed: the same first epoch (its last row may join the next epoch's text)
    assert both[:len(first) - 1] == first[:-1]
    second = both[len(first):]
    assert len(second) > 100 and not set(second) & set(first)


def test_roberta_bos_id_0_is_a_real_token_when_segment_ids_are_given(tmp_path):
    """RoBERTa's <s> is id 0, t5lite's padding id: with segment ids the encoder takes padding
    from them, so a real batch (<s> first, some rows padded) matches HF at every position."""
    hf_model = _hf_roberta(seed=5)
    cfg, params = convert.hf_to_t5lite(F.save_hf_model(hf_model, tmp_path / "hf"))
    hf_batch, batch, real = _batch(np.random.default_rng(11))
    batch["encoder_input_tokens"][:, 0] = 0  # <s>
    hf_batch["input_ids"][:, 0] = 0
    with torch.no_grad():
        ref = hf_model(**hf_batch).logits.numpy()
    diff = np.abs(_ours(cfg, params, batch) - ref)
    assert float(diff[real].max()) <= F.PARITY_TOL, float(diff[real].max())
    assert float(diff[:, 0].max()) <= F.PARITY_TOL
