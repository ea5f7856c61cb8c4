"""A train step's per-chip memory: the compiled program's figures (what libtpu's HBM check
compares) and an analytic estimate of its live set from the shapes (a model, not a bound)."""

from __future__ import annotations

import math



def memory_total(mem) -> int:
    """Per-chip bytes a compiled program needs (its memory_analysis()): the backend's peak
    (arguments, outputs and the temporaries live at once) where it reports one, as libtpu
    does; else arguments + outputs not aliased to (donated) arguments + temporaries.

    On TPU the peak is what the compiler's own HBM check compares (it refuses a program whose
    peak exceeds the chip's HBM and compiles one whose arguments + temp_size_in_bytes exceed
    it: tests/test_tpu_costs.py); temp_size_in_bytes is a larger figure than the temporaries
    live at the peak, so the sum overstates every scanned step."""
    peak = getattr(mem, "peak_memory_in_bytes", 0) or 0
    return int(peak) if peak > 0 else _io_bytes(mem) + mem.temp_size_in_bytes


def _io_bytes(mem) -> int:
    """Arguments + outputs not aliased to (donated) arguments."""
    return mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes


def memory_bytes(mem) -> dict:
    """bytes_per_chip's compiled part: arguments, outputs, aliased, temp (the temporaries
    live at the peak: total - arguments - outputs not aliased), xla_temp (XLA's
    temp_size_in_bytes), total (memory_total)."""
    total = memory_total(mem)
    live_io = _io_bytes(mem)
    return {"arguments": mem.argument_size_in_bytes, "outputs": mem.output_size_in_bytes,
            "aliased": mem.alias_size_in_bytes, "temp": max(total - live_io, 0),
            "xla_temp": mem.temp_size_in_bytes, "total": total}


def _layer_elements(m, tensor: int, t, s_self, s_cross=0) -> tuple:
    """Per-sequence element counts of one layer of model config ``m`` on t tokens, heads and
    MLP width split ``tensor`` ways: (saved by m.remat, all)."""
    from t5lite.models.layers import GATED
    d, hk, h = m.d_model, m.num_heads * m.head_dim / tensor, m.num_heads / tensor
    f = m.d_ff / tensor
    wi = f * (2 if m.ffn in GATED else 1)
    attn = 2 * d + 3 * hk + h * s_self + hk
    mlp = 2 * d + wi + f
    cross = (2 * d + hk + h * s_cross + hk) * t + 2 * hk * s_cross if s_cross else 0
    everything = (attn + mlp) * t + cross
    named = (d + 3 * hk + d + wi + d) * t + (hk + d) * t * bool(s_cross) + (
        2 * hk * s_cross)
    return {"full": d * t, "minimal": named, "none": everything}[m.remat], everything


def _stacks(m, lengths: dict, tensor: int) -> tuple:
    """([(layers, _layer_elements) per stack], tokens the logits cover) of model config m."""
    arch = m.architecture
    if arch == "encoder_decoder":
        t_in, t_out = lengths.get("inputs", 0), lengths.get("targets", 0)
        return [(m.num_encoder_layers, _layer_elements(m, tensor, t_in, t_in)),
                (m.num_decoder_layers, _layer_elements(m, tensor, t_out, t_out, t_in))], t_out
    t = lengths.get("inputs", 0) if arch == "encoder_only" else sum(lengths.values())
    n = m.num_encoder_layers if arch == "encoder_only" else m.num_decoder_layers
    # MLM logits only at the predicted positions (models/architectures.py, mlm_positions)
    t_logits = (math.ceil(m.mlm_predict_fraction * t)
                if arch == "encoder_only" and m.mlm_predict_fraction else t)
    return [(n, _layer_elements(m, tensor, t, t))], t_logits


def analytic_bytes(cfg, mesh: dict, params: int, opt_state: int) -> dict:
    """An estimate of the per-chip memory the step lives in, from the shapes alone -> {state,
    saved, working, logits, total} bytes: what the model below counts, not a bound either way
    (a compiled peak can be below it, where XLA fuses the float32 logits into the loss, or
    above it by fusion and collective buffers; bench/RESULTS.md). ``params`` /
    ``opt_state``: per-chip bytes as sharded (the compile's arguments).

    - state: parameters + their float32 gradients (sharded as the parameters) + optimizer
      state;
    - saved: what the backward pass needs from the forward, per layer in the compute dtype,
      by remat policy: ``full`` the layer input; ``minimal`` also the named projection outputs
      (q, k, v, attention out, MLP wi / wo); ``none`` every activation the layer's gradient
      reads (norm inputs and outputs, q, k, v, the attention probabilities, the attention
      output, the MLP pre-activations and hidden);
    - working: one layer's activations as with ``none`` (being recomputed or differentiated)
      plus its gathered bf16 weights (fsdp all-gathers one layer at a time);
    - logits: the output layer's logits in float32 and the compute dtype (the loss and its
      gradient read them), at every output position, or for BERT-style MLM with
      model.mlm_predict_fraction f only at the ceil(f x L) predicted ones.
    Tokens per chip divide the batch by data x fsdp; heads and MLP width divide by tensor.
    The compiled temporaries add fusion buffers, the collectives' landing buffers and
    prefetch double-buffering."""
    from t5lite.models.layers import GATED
    m = cfg.model
    itemsize = 2 if m.dtype == "bfloat16" else 4
    shards = max(mesh.get("data", 1) * mesh.get("fsdp", 1), 1)
    tensor = max(mesh.get("tensor", 1), 1)
    seqs = cfg.data.batch_size / shards
    stacks, t_logits = _stacks(m, cfg.data.feature_lengths, tensor)
    saved = sum(n * s for n, (s, _) in stacks) * seqs * itemsize
    gated = m.ffn in GATED
    layer_params = (4 * m.num_heads * m.head_dim * m.d_model
                    + (3 if gated else 2) * m.d_ff * m.d_model) / tensor
    working = max(a for _, (_, a) in stacks) * seqs * itemsize + 2 * layer_params
    logits = seqs * t_logits * m.vocab_size / tensor * (4 + itemsize)
    state = 2 * params + opt_state
    parts = {"state": state, "saved": saved, "working": working, "logits": logits}
    return dict({k: int(v) for k, v in parts.items()}, total=int(sum(parts.values())))
