"""Which layer gets which variant (issue 38's architecture rows), and the encoder loop for the
variants that change the encoder's length or hand the decoder every layer's output.

A stack whose layers are not all alike (an FFN replaced in some layers only, Funnel pooling,
transparent attention's per-layer outputs) is built unscanned (``layers_0`` ...), whatever
model.scan_layers says: nn.scan needs one layer repeated.
"""

from __future__ import annotations

from t5lite.models import funnel, transparent
from t5lite.models.moe import SparseMLP
from t5lite.models.pkm import ProductKeyMemory
from t5lite.models.weighted import BranchedAttention


def ffn_layer_at(cfg, kind: str, index: int, depth: int) -> str:
    """The FFN kind ("dense", "moe", "switch", "pkm") of layer ``index`` of a ``kind`` stack
    of ``depth`` layers."""
    if cfg.ffn_layer == "dense" or cfg.ffn_layer_stacks not in ("both", kind):
        return "dense"
    if cfg.ffn_layer_at:
        chosen = {i % depth for i in cfg.ffn_layer_at if -depth <= i < depth}
        return cfg.ffn_layer if index in chosen else "dense"
    return cfg.ffn_layer if (index + 1) % cfg.ffn_layer_every == 0 else "dense"


def layer_fields(cfg, kind: str, depth: int) -> list[dict]:
    """The per-layer Block fields of a ``kind`` stack that differ from the defaults (FFN
    kind, Funnel pooling); other block types (no such fields) get empty dicts."""
    fields = [dict(ffn_layer=ffn_layer_at(cfg, kind, i, depth), pool=funnel.pool_at(cfg, kind, i))
              for i in range(depth)]
    return [{k: v for k, v in f.items() if v not in ("dense", 1)} for f in fields]


def custom_encoder(cfg, kind: str) -> bool:
    """The encoder runs through run_encoder (Funnel pooling or transparent attention)."""
    return kind == "encoder" and bool(cfg.funnel_blocks or cfg.transparent_attention)


def scanned(cfg, kind: str, depth: int) -> bool:
    """The stack's layers are one scanned layer: model.scan_layers and all layers alike."""
    fields = layer_fields(cfg, kind, depth)
    alike = all(f == fields[0] for f in fields)
    return cfg.scan_layers and alike and not custom_encoder(cfg, kind)


def ffn_module(cfg, ffn_layer: str, dense_cls):
    """The FFN sub-layer's class for ``ffn_layer`` (``dense_cls``: the stack's dense MLP)."""
    return {"moe": SparseMLP, "switch": SparseMLP, "pkm": ProductKeyMemory}.get(
        ffn_layer, dense_cls)


def ffn_inputs(ffn_layer: str, ctx, decoder: bool) -> dict:
    """What the FFN sub-layer takes besides (x, deterministic): a mixture of experts routes
    only the real tokens (the reference leaves padding out of routing) and sizes a decoder
    layer's capacity by the decoder's factor."""
    if ffn_layer not in ("moe", "switch"):
        return {}
    return {"valid_BL": ctx.valid, "decoder": decoder}


def has_ffn_sublayer(cfg) -> bool:
    """Weighted Transformer blocks carry their FFN inside the (branched) attention."""
    return not cfg.weighted_transformer


def run_encoder(stack, x_BLD, ctx, deterministic=True):
    """The encoder's layers one by one: a layer that pools (Funnel) shortens the context for
    the layers after it; with transparent attention the result is every layer's output
    stacked [B, N+1, S, D] (transparent.stack_outputs), else the final output [B, S', D]."""
    outputs = [x_BLD]
    for layer in stack.layers:
        x_BLD = layer(x_BLD, ctx, deterministic, False)
        if layer.pool > 1:
            ctx = funnel.pool_context(ctx, layer.pool)
        outputs.append(x_BLD)
    final_BLD = stack.finish(x_BLD, deterministic)
    if not stack.cfg.transparent_attention:
        return final_BLD
    return transparent.stack_outputs(outputs[:-1] + [final_BLD])


def core_modules(cfg, modules):
    """The core StackModules for ``cfg``: branched attention for the Weighted Transformer."""
    if cfg.weighted_transformer:
        return modules._replace(attention=BranchedAttention)
    return modules


def layers_alike(cfg) -> bool:
    """Every layer of each stack has the same parameters (a stack's count is one layer's times
    its depth; Funnel blocks need their whole depth to validate)."""
    if cfg.funnel_blocks:
        return False
    for kind, depth in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
        fields = layer_fields(cfg, kind, depth)
        if any(f != fields[0] for f in fields):
            return False
    return True
