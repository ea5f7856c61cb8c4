"""Evaluation: seqio.Evaluator glue (predict by decoding, score by log-likelihood), periodic
evaluation with best-checkpoint keeping during training, and `infer` (records for input
lines). What the `eval` / `infer` commands print and read lives in commands.py.

seqio.Evaluator reads each task's split once, applies its postprocess_fn and metric_fns, and
asks us for model outputs through predict_fn / score_fn. We hand it the task features as they
are (PassThroughFeatureConverter) and build the model batches here, so one code path serves
encoder-decoder (encoder = inputs) and decoder-only / prefix LM (prompt = BOS 0 + inputs, as
seqio's PrefixLM converter lays out training examples). Classifier-head models (num_classes > 0)
are scored by argmax(class_logits) == class_labels over the split.
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterable, Optional, Sequence

import jax
import numpy as np

from t5lite import config as config_lib
from t5lite.errors import UserError
from t5lite.eval import decoding
from t5lite.mesh import partitioning


# ----------------------------------------------------------------------------- model batches


def _pad(rows: Sequence[Sequence[int]], length: int) -> np.ndarray:
    out = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
        r = list(r)[:length]
        out[i, :len(r)] = r
    return out


def _round_up(n: int, k: int) -> int:
    return max(k, -(-n // k) * k)


def score_batch(architecture: str, inputs, targets, input_length: int, target_length: int):
    """Teacher-forced model batch (CONTRACTS.md keys) scoring `targets` given `inputs`."""
    if architecture == "encoder_decoder":
        tgt = _pad(targets, target_length)
        dec_in = np.concatenate([np.zeros((len(tgt), 1), np.int32), tgt[:, :-1]], 1)
        # every given token is scored, a 0 a decoder emitted included (by position, as below)
        n = np.array([min(len(t), target_length) for t in targets])[:, None]
        return {"encoder_input_tokens": _pad(inputs, input_length),
                "decoder_input_tokens": dec_in, "decoder_target_tokens": tgt,
                "decoder_loss_weights": (np.arange(target_length)[None] < n).astype(np.int32)}
    n = input_length + target_length
    seqs = [list(i)[:input_length] + list(t)[:target_length] for i, t in zip(inputs, targets)]
    tgt = _pad(seqs, n)
    dec_in = np.concatenate([np.zeros((len(tgt), 1), np.int32), tgt[:, :-1]], 1)
    pos = np.arange(n)[None]
    n_in = np.array([min(len(i), input_length) for i in inputs])[:, None]
    n_all = np.array([len(s) for s in seqs])[:, None]
    batch = {"decoder_input_tokens": dec_in, "decoder_target_tokens": tgt,
             "decoder_loss_weights": ((pos >= n_in) & (pos < n_all)).astype(np.int32),
             "decoder_segment_ids": (pos < n_all).astype(np.int32),
             "decoder_positions": np.broadcast_to(pos, tgt.shape).astype(np.int32)}
    if architecture == "prefix_lm":  # bidirectional over BOS + inputs
        batch["decoder_causal_attention"] = (pos < n_in + 1).astype(np.int32)
    return batch


class Predictor:
    """Decodes / scores token lists in fixed-shape batches (one compile per program)."""

    def __init__(self, cfg, model, params, eos_id: int, mesh=None):
        cfg = config_lib.with_decode_length(cfg)  # 0: as long as the targets
        self.cfg, self.model, self.params, self.eos_id, self.mesh = cfg, model, params, eos_id, mesh
        arch = cfg.model.architecture
        if arch == "encoder_only":
            raise UserError("encoder_only (BERT) checkpoints do not generate or score text; "
                            "use `t5lite eval` on a classification task (e.g. sentiment_cls).")
        self.arch = arch
        lengths = cfg.data.feature_lengths
        self.input_length = lengths.get("inputs", 0)
        self.target_length = lengths.get("targets", cfg.decode.max_length)
        if arch != "encoder_decoder" and self.input_length == 0:
            self.input_length = lengths["targets"]  # LM: a prompt as long as a training row
        # decoder-only prompt: BOS 0 + inputs (as in training, where inputs fill input_length)
        self.prompt_length = self.input_length + (arch != "encoder_decoder")
        decoding.check(cfg.decode, cfg.model, 1 if arch == "encoder_decoder" else
                       self.prompt_length)
        dp = 1 if mesh is None else mesh.shape["data"] * mesh.shape["fsdp"]
        self.batch_size = _round_up(cfg.eval.batch_size, dp)
        # on a TPU mesh, the train step's XLA options (asynchronous collectives) for these too
        options = partitioning.compiler_options(cfg, mesh)
        self._generate = decoding.make_generate_fn(model, cfg.decode, eos_id, options)
        self._score = decoding.make_score_fn(model, options)
        self._key = jax.random.key(cfg.decode.seed)

    def _ctx(self):
        if self.mesh is None:
            return contextlib.nullcontext()
        return partitioning.activate(self.mesh)

    def _chunks(self, n: int, desc: str = "") -> Iterable[tuple[int, int]]:
        from t5lite import progress
        with progress.bar(total=n, desc=desc, unit="ex", leave=False,
                          disable=n <= self.batch_size or jax.process_index() != 0) as bar:
            for start in range(0, n, self.batch_size):
                yield start, min(n, start + self.batch_size)
                bar.update(min(n, start + self.batch_size) - start)

    def predict(self, inputs: Sequence[Sequence[int]],
                answer_fn=None) -> tuple[np.ndarray, list[float]]:
        """[N, decode.max_length] token ids (EOS, then 0s) and scores, one row per input.
        answer_fn: decode.method=self_consistency's map from a sample's ids to its final
        answer (decoding.vote; default: the ids)."""
        if self.arch != "encoder_decoder":
            inputs = [[0] + list(x)[:self.input_length] for x in inputs]
        preds, scores = [], []
        for a, b in self._chunks(len(inputs), f"decode ({self.cfg.decode.method})"):
            rows = list(inputs[a:b]) + [[0]] * (self.batch_size - (b - a))
            x = _pad(rows, self.prompt_length)
            lengths = np.maximum(np.array([min(len(r), self.prompt_length) for r in rows]), 1)
            key = jax.random.fold_in(self._key, a)
            with self._ctx():
                out = jax.device_get(self._generate(self.params, x, lengths.astype(np.int32),
                                                    key, answer_fn))
            preds.append(out["tokens"][:b - a])
            scores += [float(v) for v in out["scores"][:b - a]]
        return np.concatenate(preds), scores

    def strip(self, row) -> list[int]:
        """Ids before the first EOS (and no padding)."""
        row = [int(t) for t in row]
        return row[:row.index(self.eos_id)] if self.eos_id in row else [t for t in row if t]

    def score(self, inputs, targets) -> list[float]:
        """log p(targets | inputs) summed over target tokens (EOS included if given)."""
        out = []
        for a, b in self._chunks(len(inputs), "score"):
            pad = self.batch_size - (b - a)
            batch = score_batch(self.arch, list(inputs[a:b]) + [[]] * pad,
                                list(targets[a:b]) + [[]] * pad, self.input_length,
                                self.target_length)
            with self._ctx():
                out += [float(v) for v in jax.device_get(self._score(self.params, batch))[:b - a]]
        return out


# ----------------------------------------------------------------------------- seqio evaluation


def _sequence_lengths(cfg, task) -> Optional[dict]:
    """Truncate eval features to the training lengths (the model has seen no longer rows)."""
    lengths = {k: v for k, v in cfg.data.feature_lengths.items() if k in task.output_features}
    return lengths or None


def _task_features_converter():
    """seqio's pass-through converter, completed with what seqio.Evaluator reads from it."""
    import seqio

    class TaskFeatures(seqio.PassThroughFeatureConverter):
        TASK_FEATURES = {}
        pack = False

    return TaskFeatures()


def _make_evaluator(cfg, task_name: str, split: str, max_examples: int, log_dir: str):
    """seqio.Evaluator for ``task_name``'s ``split`` (UserError if it has no such split or no
    metrics) and the task's subtasks."""
    import seqio
    from absl import logging as absl_logging

    from t5lite.tasks import pipeline
    provider = pipeline.get_mixture_or_task(task_name)
    if split not in provider.splits:
        raise UserError(f"{task_name!r} has no split {split!r}; it has "
                        f"{', '.join(provider.splits)}.")
    subtasks = seqio.get_subtasks(provider)
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)  # seqio warns when lengths have slack
    try:
        # max_examples: a seeded sample of the split, the same at every checkpoint (seqio
        # shuffles once with the task's buffer, the whole split for the local finetuning
        # sets, then takes the first max_examples). The prepared split files are ordered
        # (by label, by package name), so the split's head would be one label or one corner.
        evaluator = seqio.Evaluator(
            task_name, feature_converter=_task_features_converter(), eval_split=split,
            sequence_length=_sequence_lengths(cfg, subtasks[0]),
            num_examples=max_examples or None, shuffle=bool(max_examples),
            seed=cfg.decode.seed, use_memory_cache=True,
            async_compute_metrics=False, log_dir=log_dir or None,
            logger_cls=[seqio.JSONLogger] if log_dir else ())
    finally:
        absl_logging.set_verbosity(verbosity)
    if not evaluator.eval_tasks:
        raise UserError(f"{task_name!r} has no metric_fns for split {split!r}: nothing to "
                        "evaluate. Pick a finetuning task (see `t5lite tasks list`).")
    return evaluator, subtasks


def _examples(ds) -> tuple[list, list, list]:
    """(index, input ids, target ids) of each example of seqio's indexed eval dataset."""
    idx, ins, tgts = [], [], []
    for i, ex in ds.as_numpy_iterator():
        idx.append(int(i))
        ins.append(ex["inputs"].tolist() if "inputs" in ex else [])
        tgts.append(ex["targets"].tolist())
    return idx, ins, tgts


def _answer_fn(subtasks):
    """What self-consistency votes on: the task's postprocessed answer (a single task) or the
    raw ids (a mixture: no one postprocessor)."""
    if len(subtasks) != 1:
        return lambda ids: ids
    task = subtasks[0]

    def answer(ids):
        text = task.output_features["targets"].vocabulary.decode(list(ids))
        post = task.postprocess_fn
        return post(text, example=None, is_target=False) if post else text
    return answer


def _seqio_metrics(cfg, predictor, task_name: str, split: str, max_examples: int,
                   log_dir: str = "", step: Optional[int] = None) -> dict:
    """seqio.Evaluator's metrics; with log_dir, seqio's JSONLogger also writes every example's
    inputs, target and prediction to log_dir/<task>-<step>.jsonl (and metrics per step)."""
    evaluator, subtasks = _make_evaluator(cfg, task_name, split, max_examples, log_dir)
    answer_fn = _answer_fn(subtasks)

    def predict_fn(ds, model_feature_shapes=None):
        idx, ins, _ = _examples(ds)
        return list(zip(idx, predictor.predict(ins, answer_fn)[0]))

    def score_fn(ds, model_feature_shapes=None):
        idx, ins, tgts = _examples(ds)
        return list(zip(idx, predictor.score(ins, tgts)))

    metrics_future, _ = evaluator.evaluate(compute_metrics=True, predict_fn=predict_fn,
                                           score_fn=score_fn, step=step)
    evaluator.close()
    flat = {}
    for task, values in metrics_future.result().items():
        for name, value in values.items():
            flat[f"{task}/{name}"] = float(getattr(value, "value", value))
    return flat


def _classifier_metrics(cfg, model, params, task_name: str, split: str, max_examples: int,
                        mesh=None) -> dict:
    """Accuracy of argmax(class_logits) against class_labels (classifier-head models)."""
    from t5lite.tasks import pipeline
    batch_size = _round_up(cfg.eval.batch_size, 1 if mesh is None else
                           mesh.shape["data"] * mesh.shape["fsdp"])
    ds = pipeline.get_dataset(task_name, dict(cfg.data.feature_lengths),
                              cfg.model.architecture, batch_size, split=split, shuffle=False,
                              pack=False, num_epochs=1, drop_remainder=False)
    fwd = jax.jit(lambda p, b: model.apply({"params": p}, b, deterministic=True)["class_logits"],
                  compiler_options=partitioning.compiler_options(cfg, mesh))
    correct = total = 0
    labels_seen = []
    for batch in ds.as_numpy_iterator():
        n = len(batch["class_labels"])
        if max_examples and total >= max_examples:
            break
        padded = {k: np.concatenate([v, np.zeros((batch_size - n,) + v.shape[1:], v.dtype)])
                  for k, v in batch.items()}
        ctx = contextlib.nullcontext()
        if mesh is not None:
            ctx = partitioning.activate(mesh)
        with ctx:
            pred = np.asarray(jax.device_get(fwd(params, padded)))[:n].argmax(-1)
        keep = n if not max_examples else min(n, max_examples - total)
        correct += int((pred[:keep] == batch["class_labels"][:keep]).sum())
        labels_seen += batch["class_labels"][:keep].tolist()
        total += keep
    if not total:
        raise UserError(f"{task_name!r} split {split!r} is empty.")
    majority = 100.0 * max(np.bincount(labels_seen)) / total
    return {f"{task_name}/accuracy": 100.0 * correct / total,
            f"{task_name}/majority_class": majority}


def _eos_id(cfg) -> int:
    from t5lite.tasks import pipeline
    task = pipeline.get_mixture_or_task(cfg.data.mixture_or_task)
    return int(task.output_features["targets"].vocabulary.eos_id)


def _no_classifier(m) -> str:
    """What to do with a BERT checkpoint eval cannot score: BERT does not generate text, so
    eval measures its classifier head, which MLM pretraining does not train."""
    heads = [h for h, on in (("token", m.num_token_classes), ("span", m.span_head)) if on]
    if heads:
        return (f"eval scores BERT classifier heads (model.num_classes > 0); this checkpoint "
                f"has {' and '.join(heads)} heads only, which eval does not score.")
    return ("this BERT checkpoint has no classifier head (model.num_classes=0, as after MLM "
            "pretraining) and BERT does not generate text: finetune it on a classification "
            "task first, e.g. `t5lite train --config configs/tiny_bert_sentiment.py --workdir "
            "runs/bert_cls --set checkpoint.init_from=CHECKPOINT` (with the task and "
            "model.vocab_size of the checkpoint's vocabulary), then `t5lite eval --workdir "
            "runs/bert_cls`.")


def evaluate(cfg, model, params, tasks: Sequence[str] = (), split: str = "",
             max_examples: int = -1, mesh=None, log_dir: str = "",
             step: Optional[int] = None) -> dict:
    """{"task/metric": value} for each task (default cfg.eval.tasks or data.mixture_or_task).
    log_dir: also save the decoded predictions there (seqio.JSONLogger, per step)."""
    import t5lite.tasks  # noqa: F401  registers tasks
    tasks = tuple(tasks) or tuple(cfg.eval.tasks) or (cfg.data.mixture_or_task,)
    split = split or cfg.eval.split
    max_examples = cfg.eval.max_examples if max_examples < 0 else max_examples
    out = {}
    if cfg.model.num_classes > 0:
        for t in tasks:
            out.update(_classifier_metrics(cfg, model, params, t, split, max_examples, mesh))
        return out
    if cfg.model.architecture == "encoder_only":
        raise UserError(_no_classifier(cfg.model))
    predictor = Predictor(cfg, model, params, _eos_id(cfg), mesh)
    for t in tasks:
        out.update(_seqio_metrics(cfg, predictor, t, split, max_examples, log_dir, step))
    return out


# ----------------------------------------------------------------------------- during training


class TrainEvaluator:
    """Runs `evaluate` every cfg.eval.every_steps (and at the end of training), logs the
    metrics, and keeps the best params by cfg.eval.best_metric in workdir/best (a params-only
    checkpoint: config.json + params/ + metrics.json, readable by eval / infer / init_from)."""

    def __init__(self, cfg, model, workdir: str, mesh, logger=None):
        self.cfg, self.model, self.mesh, self.logger = cfg, model, mesh, logger
        from etils import epath
        from t5lite.store import checkpointing, paths
        # workdirs may be local or gs://: file I/O through epath (see store.paths.abspath)
        self.best_dir = epath.Path(paths.abspath(workdir)) / "best"
        kept = checkpointing.read_metadata(str(self.best_dir), "metrics.json")
        # resumed run: beat the best kept so far
        self.best = None if kept is None else kept.get(cfg.eval.best_metric)

    @staticmethod
    def wanted(cfg) -> bool:
        e = cfg.eval
        return bool(e.every_steps or e.best_metric or e.tasks)

    def due(self, step: int, total: int) -> bool:
        every = self.cfg.eval.every_steps
        return step == total or (every > 0 and step % every == 0)

    def __call__(self, step: int, params) -> dict:
        t0 = time.time()
        if self.logger is not None:  # decoding a split takes a while: never a silent wait
            c = self.cfg
            tasks = ", ".join(c.eval.tasks or (c.data.mixture_or_task,))
            self.logger.info(f"step {step} eval_tasks: decoding {tasks} {c.eval.split} "
                             f"({c.decode.method}) ...")
        # what the model produced, per eval step: eval_predictions/<task>-<step>.jsonl
        log_dir = ""
        if jax.process_index() == 0:
            log_dir = self.best_dir.parent / "eval_predictions"
            log_dir.mkdir(parents=True, exist_ok=True)
            log_dir = str(log_dir)
        metrics = evaluate(self.cfg, self.model, params, mesh=self.mesh, log_dir=log_dir,
                           step=step)
        if self.logger is not None:
            self.logger.write(step, dict(metrics, seconds=time.time() - t0), prefix="eval_tasks")
        name = self.cfg.eval.best_metric
        if name:
            if name not in metrics:
                raise UserError(f"eval.best_metric={name!r} is not among the metrics "
                                f"{', '.join(sorted(metrics))}.")
            value = metrics[name]
            better = self.best is None or (value > self.best if self.cfg.eval.best_mode == "max"
                                           else value < self.best)
            if better:
                self.best = value
                self._save(step, params, metrics)
                if self.logger is not None:
                    self.logger.info(f"step {step}: new best {name}={value:.2f} -> "
                                     f"{self.best_dir}")
        return {f"eval/{k}": v for k, v in metrics.items()}

    def _save(self, step: int, params, metrics: dict) -> None:
        from t5lite.store import checkpointing
        checkpointing.save_params_dir(str(self.best_dir), self.cfg, params,
                                      {"metrics.json": {"step": step, **metrics}}, overwrite=True)


# ------------------------------------------------------------------------ checkpoint -> records


def load(checkpoint: str, overrides: Sequence[str] = (), say_kernel: bool = True):
    """-> (cfg with overrides applied, model, params) from any checkpoint layout. Says on
    stderr (stdout may be `infer`'s output) what model.attention_kernel="auto" runs here, or
    that "flash" runs interpreted off a TPU, as training does."""
    from t5lite import peft
    from t5lite.models import gpu_attention
    from t5lite import progress
    from t5lite.store import checkpointing
    with progress.quiet_absl():
        cfg, params = checkpointing.load_params(checkpoint)
    cfg = config_lib.apply_overrides(cfg, overrides)
    config_lib.validate(cfg)
    decoding.check(cfg.decode)
    from t5lite import dataprep
    dataprep.use_data_dir(cfg.data.data_dir)
    from t5lite.tasks import builtin, pipeline, tfds_dir
    tfds_dir.use_tfds_data_dir(cfg.data.tfds_data_dir)
    builtin.use_paper_vocabulary(cfg.data.paper_vocabulary)
    pipeline.import_task_modules(cfg.data.task_modules, cfg.data.task_module_files)
    if say_kernel and (line := gpu_attention.describe(cfg.model)):
        print(f"t5lite: {line}", file=sys.stderr, flush=True)
    return cfg, peft.build_model(cfg.model), params


def load_ensemble(checkpoints: Sequence[str], overrides: Sequence[str] = ()):
    """-> (the first member's cfg with overrides applied, model, decoding.Ensemble of every
    member's params): members of one model config, decoded with the mean of their logits."""
    loaded = [load(c, overrides, say_kernel=i == 0) for i, c in enumerate(checkpoints)]
    cfg, model, _ = loaded[0]
    for c, (other, _, _) in zip(checkpoints[1:], loaded[1:]):
        if other.model != cfg.model:
            raise UserError(f"{c} has another model config than {checkpoints[0]}: an "
                            "ensemble's members must share model.* (architecture and sizes).")
    return cfg, model, decoding.ensemble([params for _, _, params in loaded])


def io_vocabularies(cfg):
    """-> (input vocabulary, output vocabulary, whether inputs end with EOS) of the
    checkpoint's task (or cfg.eval.vocabulary for both)."""
    from t5lite.tasks import pipeline, vocabularies
    if cfg.eval.vocabulary:
        v = vocabularies.get_vocabulary(cfg.eval.vocabulary)
        return v, v, True
    task = pipeline.get_mixture_or_task(cfg.data.mixture_or_task)
    feats = task.output_features
    inp = feats.get("inputs", feats["targets"])
    return inp.vocabulary, feats["targets"].vocabulary, bool(inp.add_eos and "inputs" in feats)



def infer(cfg, model, params, lines: Sequence[str], mode: str = "predict",
          options: Sequence[str] = (), prefix: str = "") -> list[dict]:
    """Records for input lines (what `t5lite infer` writes, one JSON line each).

    ``prefix``: the task's text-to-text prefix (e.g. "sst2 sentence:"), joined to every input
    with a space as the task's preprocessors do; records show the input as given.

    predict: {"input", "prediction", "score"} (score: log-likelihood of the output; for beam
    search its length-normalised score). score: lines are "input<TAB>target" ->
    {"input", "target", "log_likelihood"}. rank: {"input", "prediction", "scores"}: the
    ``options`` candidate with the highest log-likelihood (rank classification, T5 paper).
    """
    in_vocab, out_vocab, add_eos = io_vocabularies(cfg)
    eos = int(out_vocab.eos_id)
    predictor = Predictor(cfg, model, params, eos)

    def enc(text, vocab, eos_too):
        ids = list(vocab.encode(text))
        return ids + [eos] if eos_too else ids

    def enc_in(text):
        return enc(f"{prefix.strip()} {text}" if prefix.strip() else text, in_vocab, add_eos)

    if mode == "predict":
        preds, scores = predictor.predict([enc_in(x) for x in lines])
        return [{"input": x, "prediction": out_vocab.decode(predictor.strip(p)), "score": s}
                for x, p, s in zip(lines, preds, scores)]
    if mode == "score":
        pairs = [x.split("\t", 1) for x in lines]
        if any(len(p) != 2 for p in pairs):
            raise UserError("--mode score reads lines of the form: input<TAB>target")
        lls = predictor.score([enc_in(a) for a, _ in pairs],
                              [enc(b, out_vocab, True) for _, b in pairs])
        return [{"input": a, "target": b, "log_likelihood": s}
                for (a, b), s in zip(pairs, lls)]
    if mode == "rank":
        if len(options) < 2:
            raise UserError("--mode rank needs at least two --options (candidate targets), "
                            "e.g. --options positive --options negative")
        ins = [enc_in(x) for x in lines for _ in options]
        outs = [enc(o, out_vocab, True) for _ in lines for o in options]
        lls = np.array(predictor.score(ins, outs)).reshape(len(lines), len(options))
        return [{"input": x, "prediction": options[int(np.argmax(s))],
                 "scores": dict(zip(options, map(float, s)))} for x, s in zip(lines, lls)]
    raise UserError(f"--mode {mode!r}: use predict, score or rank.")
