"""Shared by the model and training tests: a tiny config and synthetic batches with the
contract's keys (so these tests do not depend on the data pipeline)."""

import numpy as np

from t5lite import config as config_lib


def tiny_config(architecture="decoder_only", batch_size=16, length=16, dropout=0.0,
                optim="adamw", lr=3e-3) -> config_lib.Config:
    cfg = config_lib.Config(name="tiny_test")
    m = cfg.model
    m.architecture = architecture
    m.vocab_size, m.d_model, m.num_heads, m.head_dim, m.d_ff = 128, 32, 4, 8, 64
    m.num_encoder_layers = m.num_decoder_layers = 1
    m.dropout_rate = dropout
    m.position = "relative" if architecture == "encoder_decoder" else "learned"
    m.max_length = 64
    cfg.data.feature_lengths = ({"inputs": length, "targets": length // 2}
                                if architecture == "encoder_decoder" else
                                {"inputs": length} if architecture == "encoder_only" else
                                {"targets": length})
    cfg.data.batch_size = batch_size
    cfg.optim.name, cfg.optim.learning_rate = optim, lr
    cfg.optim.schedule, cfg.optim.warmup_steps = "constant", 0
    cfg.train.log_every = 1
    cfg.train.eval_every = 0
    cfg.train.eval_steps = 1
    cfg.checkpoint.async_save = True
    return cfg


def synthetic_batch(cfg, rng, batch_size=None) -> dict:
    """A learnable batch: targets are inputs shifted by one, over a repeating pattern."""
    B = batch_size or cfg.data.batch_size
    V = cfg.model.vocab_size
    arch = cfg.model.architecture
    fl = cfg.data.feature_lengths

    def seq(n):
        start = rng.integers(1, V - 1, size=(B, 1))
        return (1 + (start + np.arange(n + 1)) % (V - 2)).astype(np.int32)

    ones = lambda n: np.ones((B, n), np.int32)  # noqa: E731
    pos = lambda n: np.tile(np.arange(n, dtype=np.int32), (B, 1))  # noqa: E731
    if arch == "encoder_decoder":
        n, t = fl["inputs"], fl["targets"]
        s = seq(t)
        return {"encoder_input_tokens": seq(n)[:, :n], "encoder_segment_ids": ones(n),
                "encoder_positions": pos(n),
                "decoder_input_tokens": np.concatenate([np.zeros((B, 1), np.int32),
                                                        s[:, :t - 1]], 1),
                "decoder_target_tokens": s[:, :t], "decoder_loss_weights": ones(t),
                "decoder_segment_ids": ones(t), "decoder_positions": pos(t)}
    if arch == "encoder_only":
        n = fl["inputs"]
        s = seq(n)[:, :n]
        mask = rng.random((B, n)) < 0.15
        mask[:, 0] = True
        return {"encoder_input_tokens": np.where(mask, V - 1, s).astype(np.int32),
                "encoder_target_tokens": s, "encoder_loss_weights": mask.astype(np.int32),
                "encoder_segment_ids": ones(n), "encoder_positions": pos(n)}
    n = fl["targets"]
    s = seq(n)
    return {"decoder_input_tokens": s[:, :n], "decoder_target_tokens": s[:, 1:],
            "decoder_loss_weights": ones(n), "decoder_segment_ids": ones(n),
            "decoder_positions": pos(n)}


def random_model_batch(cfg, b, n_in, n_tgt, seed=0, high=None) -> dict:
    """models.dummy_batch(cfg) with random token ids in [1, high or vocab) and positions
    0..L-1 (one segment a row, no padding): a batch any architecture's forward pass takes."""
    from t5lite.models import dummy_batch
    batch = dummy_batch(cfg, b, {"inputs": n_in, "targets": n_tgt})
    rng = np.random.default_rng(seed)
    for k in ("encoder_input_tokens", "decoder_input_tokens", "decoder_target_tokens",
              "encoder_target_tokens"):
        if k in batch:
            batch[k] = rng.integers(1, high or cfg.vocab_size, batch[k].shape).astype(
                np.int32)
    for k in ("encoder_positions", "decoder_positions"):
        if k in batch:
            batch[k] = np.broadcast_to(np.arange(batch[k].shape[1]), batch[k].shape).astype(
                np.int32)
    return batch


def steps_per_accumulation(cfg, micro_steps, batch=None):
    """One jitted train step of ``cfg``'s model on its mesh from the same initial state and
    global batch (``batch``: a host batch, by default a synthetic one) with
    ``cfg.train.grad_accum_steps`` set to each of ``micro_steps``. Returns the initial params
    and {k: (metrics, params after the step)}, on the host."""
    import jax

    from t5lite.models import build_model
    from t5lite.mesh import partitioning
    from t5lite.train import optim, trainer
    model = build_model(cfg.model)
    mesh = partitioning.make_mesh(cfg.mesh)
    tx = optim.make_optimizer(cfg.optim, 10)
    state0, shardings = trainer.create_train_state(cfg, model, mesh, tx)
    state0 = jax.device_get(state0)
    batch = synthetic_batches(cfg, 1)[0] if batch is None else batch
    batch = partitioning.global_batch(batch, partitioning.batch_sharding(mesh))
    out = {}
    for k in micro_steps:
        cfg.train.grad_accum_steps = k
        step = trainer.make_train_step(cfg, model, tx, mesh, shardings)
        state, metrics = step(jax.device_put(state0, shardings), batch)
        out[k] = jax.device_get((metrics, state.params))
    return state0.params, out


def synthetic_batches(cfg, n, seed=0):
    rng = np.random.default_rng(seed)
    return [synthetic_batch(cfg, rng) for _ in range(n)]


def tf_iterator(cfg, n=64, seed=0):
    """A checkpointable tf.data iterator (repeating) over n synthetic batches."""
    import tensorflow as tf
    batches = synthetic_batches(cfg, n, seed)
    stacked = {k: np.stack([b[k] for b in batches]) for k in batches[0]}
    return iter(tf.data.Dataset.from_tensor_slices(stacked).repeat())
