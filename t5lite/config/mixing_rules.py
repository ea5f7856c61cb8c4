"""Rules for the token-mixing, block and vocabulary-layer fields of ModelConfig (the Narang et
al. 2021 rows: attention_type, conv_*, block_type, output_softmax, adaptive_input,
vocab_clusters), each error saying what to do."""

from __future__ import annotations

from t5lite.errors import UserError


def parse_clusters(clusters) -> list[tuple[int, int]]:
    """model.vocab_clusters as [(token_count, embedding_size)]: pairs, or "count:size" strings
    (what a command-line override gives: model.vocab_clusters=2500:768,6000:256,...)."""
    out = []
    for entry in clusters:
        parts = entry.split(":") if isinstance(entry, str) else list(entry)
        try:
            count, size = (int(p) for p in parts)
        except (TypeError, ValueError):
            raise UserError(f"model.vocab_clusters entries are (token_count, embedding_size) or "
                            f"'count:size', got {entry!r}.") from None
        out.append((count, size))
    return out


def check_vocab_layer(m) -> None:
    """adaptive_input / output_softmax need clusters covering the vocabulary and the shared
    (tied) embedding they replace."""
    if m.output_softmax == "softmax" and not m.adaptive_input:
        return
    what = "model.adaptive_input" if m.adaptive_input else f"output_softmax={m.output_softmax}"
    if m.adaptive_input and m.output_softmax != "softmax":
        raise UserError(f"model.adaptive_input with output_softmax={m.output_softmax}: the "
                        "adaptive softmax has adaptive inputs already and the mixture its own "
                        "embedding; set one of them.")
    if (m.architecture == "encoder_only" or not m.tie_embeddings or m.embed_dim
            or m.factorized_embed_dim):
        raise UserError(f"{what} replaces the tied token embedding of a decoder: use an "
                        "encoder_decoder / decoder_only model with tie_embeddings=True, "
                        "embed_dim=0 and factorized_embed_dim=0.")
    if m.output_softmax == "mixture":
        return
    clusters = parse_clusters(m.vocab_clusters)
    minimum = 2 if m.output_softmax == "adaptive" else 1
    if (len(clusters) < minimum or sum(n for n, _ in clusters) != m.vocab_size
            or min(n for n, _ in clusters) < 1
            or not all(0 <= e <= m.d_model for _, e in clusters)):
        raise UserError(f"{what} needs model.vocab_clusters: at least {minimum} "
                        f"(token_count, embedding_size) pairs whose counts sum to vocab_size="
                        f"{m.vocab_size}, sizes 0..d_model; got {m.vocab_clusters!r}.")


def check_mixing(m) -> None:
    """Token mixer and block type (m: ModelConfig); called by rules.check_model."""
    mixer = m.attention_type
    if mixer != "multihead" and m.position == "rope":
        raise UserError(f"attention_type={mixer} has no query-key rotation: use position="
                        "relative (the paper's) or learned / sinusoidal / alibi.")
    if mixer.endswith("_conv") and m.conv_heads and m.d_model % m.conv_heads:
        raise UserError(f"model.conv_heads={m.conv_heads} must divide d_model={m.d_model} "
                        "(each kernel covers d_model / conv_heads channels); 0 = per channel.")
    kernel = m.attention_kernel not in ("xla", "auto")  # auto is xla there
    if (mixer != "multihead" or m.block_type != "transformer") and kernel:
        raise UserError(f"attention_type={mixer} / block_type={m.block_type} read the masks as "
                        "arrays: use model.attention_kernel=xla (or auto).")
    if m.funnel_blocks and kernel:
        # a Funnel encoder pools its mask array between layers (funnel.pool_context); the
        # kernels' bias objects hold segment ids and a position table, not a mask to pool
        raise UserError(f"model.funnel_blocks pools the encoder's attention mask as an array, "
                        f"which attention_kernel={m.attention_kernel} does not build: use "
                        "model.attention_kernel=xla (or auto).")
    if mixer != "multihead" and m.weighted_transformer:
        raise UserError(f"attention_type={mixer} with weighted_transformer: the Weighted "
                        "Transformer's branched attention is its token mixer; set one of them.")
    others = [name for name, on in (("ffn_layer", m.ffn_layer != "dense"),
                                    ("funnel_blocks", bool(m.funnel_blocks)),
                                    ("weighted_transformer", m.weighted_transformer),
                                    ("transparent_attention", m.transparent_attention)) if on]
    if m.block_type == "evolved" and others:
        raise UserError(f"block_type=evolved builds its own blocks (dense FFNs, every layer "
                        f"alike): leave {', '.join('model.' + o for o in others)} at default.")
    p = m.peft
    attention_peft = bool(p.prefix_tokens or p.ia3 or (p.lora_rank and set(p.lora_targets) & {
        "query", "key", "value", "out"}))
    if mixer != "multihead" and attention_peft:
        raise UserError(f"attention_type={mixer} replaces the self-attention that LoRA on "
                        "query / key / value / out, (IA)^3 and prefix tuning adapt: use LoRA on "
                        "wi / wo, adapters or prompt tuning with it.")
    if m.block_type == "evolved" and p.adapter_dim:
        raise UserError("block_type=evolved has no adapter after its MLP: use LoRA or prompt "
                        "tuning with it (model.peft.adapter_dim=0).")
    if m.block_type == "evolved" and m.d_model % 2:
        raise UserError(f"block_type=evolved halves d_model in its branches: use an even "
                        f"d_model, got {m.d_model}.")
    check_vocab_layer(m)
