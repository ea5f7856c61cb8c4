"""Rules of the model variants of issue 38's architecture rows (mixture of experts, Switch,
product key memory, Funnel, Weighted Transformer, transparent attention): the combinations
that cannot be built, each with what to do. config.rules.check_model calls check_variants."""

from __future__ import annotations

from t5lite.errors import UserError


def check_variants(m) -> None:
    """Errors in ModelConfig ``m``'s variant fields."""
    _check_ffn_layer(m)
    if m.funnel_blocks:
        _check_funnel(m)
    if m.transparent_attention and (m.architecture != "encoder_decoder"
                                    or m.shared_encoder_decoder or m.funnel_blocks):
        raise UserError("model.transparent_attention needs an encoder_decoder model with its "
                        "own encoder layers (shared_encoder_decoder=False, no funnel_blocks).")
    if (m.universal_gating != "none" or m.universal_mix_layers) and (
            not m.universal_steps or getattr(m, "block_type", "transformer") != "transformer"):
        raise UserError("model.universal_gating / universal_mix_layers shape a Universal "
                        "Transformer: set model.universal_steps > 0 (block_type=transformer).")
    if m.ffn_init_scale != 1.0 and m.init_std > 0:
        raise UserError("model.ffn_init_scale scales the fan-in init, which model.init_std > 0 "
                        "(BERT / GPT-2: every kernel N(0, init_std)) replaces: set "
                        "init_std=0 or leave ffn_init_scale at 1.")
    if m.embed_like_classifier and (m.scale_tied_logits or m.factorized_embed_dim
                                    or m.adaptive_input or m.output_softmax != "softmax"):
        raise UserError("model.embed_like_classifier scales a plain token embedding and its "
                        "tied softmax reads it unscaled: set model.scale_tied_logits=False, "
                        "output_softmax=softmax, no factorized_embed_dim / adaptive_input.")
    if m.encoder_norm and (m.architecture not in ("encoder_decoder", "encoder_only")
                           or m.shared_encoder_decoder or m.electra.rtd_head):
        raise UserError("model.encoder_norm sets the norm of an encoder stack of its own: use "
                        "architecture encoder_decoder (shared_encoder_decoder=False) or "
                        "encoder_only without ELECTRA, or leave it empty.")
    peft = m.peft
    if m.weighted_transformer and (peft.lora_rank or peft.prompt_tokens or peft.prefix_tokens
                                   or peft.adapter_dim or peft.ia3):
        raise UserError("model.weighted_transformer builds its own attention layers, which the "
                        "PEFT methods do not adapt: turn model.peft's methods off for it.")


def _check_ffn_layer(m) -> None:
    if m.ffn_layer == "dense":
        return
    if getattr(m, "block_type", "transformer") != "transformer":
        raise UserError(f"model.ffn_layer={m.ffn_layer} replaces the FFN of Transformer "
                        "blocks: use model.block_type=transformer.")
    if m.ffn_layer in ("moe", "switch") and m.num_experts < 2:
        raise UserError(f"model.ffn_layer={m.ffn_layer} needs model.num_experts >= 2.")
    if m.ffn_layer == "pkm" and (m.pkm_knn > m.pkm_keys or m.pkm_key_dim % 2):
        raise UserError("model.ffn_layer=pkm needs pkm_knn <= pkm_keys and an even "
                        "pkm_key_dim (its two halves score the two sub-key sets).")
    depths = {"encoder": m.num_encoder_layers, "decoder": m.num_decoder_layers}
    for kind, depth in depths.items():
        if m.ffn_layer_stacks not in ("both", kind) or depth == 0:
            continue
        bad = [i for i in m.ffn_layer_at if not -depth <= int(i) < depth]
        if bad:
            raise UserError(f"model.ffn_layer_at={tuple(m.ffn_layer_at)}: {bad} is not a "
                            f"layer of the {depth}-layer {kind}; use 0..{depth - 1} or "
                            f"-{depth}..-1.")


def _check_funnel(m) -> None:
    blocks = tuple(int(b) for b in m.funnel_blocks)
    if m.architecture not in ("encoder_decoder", "encoder_only") or m.shared_encoder_decoder:
        raise UserError("model.funnel_blocks pools an encoder: use architecture "
                        "encoder_decoder (shared_encoder_decoder=False) or encoder_only.")
    if min(blocks) < 1 or sum(blocks) != m.num_encoder_layers:
        raise UserError(f"model.funnel_blocks={blocks} must be positive layer counts adding "
                        f"up to model.num_encoder_layers={m.num_encoder_layers}.")
    if m.peft.prompt_tokens:
        raise UserError("model.funnel_blocks cannot pool a prompt-tuned encoder input: set "
                        "model.peft.prompt_tokens=0.")
