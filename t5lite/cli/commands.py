"""What the CLI verbs do: load a checkpoint, call the library, print tables, read input lines
(files or stdin) and write output files. cli.py parses flags and calls one function here; the
library modules (evaluation, fewshot, convert, checkpointing) return values and print nothing
a user asked for. Heavy imports (jax, seqio, TF) stay inside the functions that need them, so
importing this module is cheap.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np

from t5lite.errors import UserError
from t5lite.text_table import format_table


# ----------------------------------------------------------------------------- train, compile, ...


def train_command(config: str, overrides: Sequence[str], workdir: str = "",
                  print_config: bool = False, allow_config_change: bool = False,
                  before_training=lambda: None, resume_from: Optional[int] = None) -> None:
    """`t5lite train`: train (or resume) in ``workdir``; ``print_config``: print the resolved,
    checked config as JSON and train nothing. ``before_training`` runs once the config is
    checked, before the trainer (and TensorFlow, seconds) is imported. ``resume_from`` S:
    the checkpoints after step S are set aside (WORKDIR/set_aside/), and the run resumes
    from S."""
    from t5lite import config as config_lib
    if print_config:
        print(json.dumps(config_lib.to_dict(config_lib.load_config(config, overrides)),
                         indent=2))
        return
    if not workdir:
        raise UserError("`t5lite train` needs --workdir DIR (or --print-config to only show "
                        "the resolved config).")
    from t5lite.store import workdir as workdir_lib
    workdir_lib.refuse_a_file(workdir)
    cfg = config_lib.load_config(config, overrides)
    before_training()
    from t5lite.train import trainer
    trainer.train(cfg, workdir, allow_config_change=allow_config_change,
                  resume_from=resume_from)


def plot_command(workdirs: Sequence[str], output: str = "", size: str = "1400x900",
                 labels: Sequence[str] = ()) -> str:
    """`t5lite plot`: the PNG (default WORKDIR/metrics.png for one run, ./metrics.png for
    several); prints where it went."""
    from t5lite.monitor import plot
    out = output or (os.path.join(workdirs[0], "metrics.png") if len(workdirs) == 1
                     else "metrics.png")
    plot.plot_runs(workdirs, out, size=size, labels=labels)
    print(f"wrote {out}")
    return out


def ablate_command(table: Optional[str], workdir: Optional[str], rows: Sequence[str] = (),
                   tasks: Sequence[str] = (), scale: Optional[str] = None,
                   overrides: Sequence[str] = (), seeds: int = 1, dry_run: bool = False,
                   list_tables: bool = False, estimate: bool = False,
                   topology: str = "", compiled: str = "") -> None:
    """`t5lite ablate`: list the tables, estimate a table's cost, or run its rows (scale
    default: paper for an estimate, tiny for a run)."""
    from t5lite import ablations
    if list_tables:
        print(ablations.list_tables())
        return
    if not table or not (workdir or estimate or topology):
        raise UserError("`t5lite ablate` needs --table NAME and --workdir DIR (or --list, or "
                        "--estimate).")
    if compiled and not topology:
        raise UserError("--compiled FILE gives compiled steps to --topology's TPU-hours: add "
                        "--topology (the slice the file's lines were compiled for).")
    if estimate or topology:
        from t5lite.ablations import pretrain_columns
        lines, record = [], None
        if compiled:
            lines, record = _compile_log(compiled)
        ablations.estimate(table, rows=rows, tasks=tasks, scale=scale or "paper",
                           overrides=overrides, seeds=seeds, topology=topology,
                           compiled=pretrain_columns.fitted_lines(lines), record=record)
        return
    ablations.run(table, workdir, rows=rows, tasks=tasks, scale=scale or "tiny",
                  overrides=overrides, dry_run=dry_run, seeds=seeds)


def _compile_log(path: str) -> tuple:
    """`ablate --compiled FILE` -> (its lines, a function appending a newly compiled stage's
    line to it): a local FILE that does not exist yet is started; a gs:// one is read only.
    Each line is written as its compile finishes, so an estimate stopped part way keeps them."""
    import json
    import os
    from t5lite.ablations import pretrain_columns
    remote = "://" in path
    if remote or os.path.exists(path):
        lines = pretrain_columns.read_compile_log(path)
    else:
        print(f"--compiled {path}: no such file yet; the stages compiled now are written there")
        lines = []
    if remote:
        return lines, None

    def record(line: dict) -> None:
        with open(path, "a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():  # after a line cut short by a killed run, start a new one
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write((json.dumps(line) + "\n").encode())
    return lines, record


def _fixed_mesh_axes(overrides) -> dict:
    """{axis: size} of the mesh axes a --set gives a size (not -1): --search holds them."""
    fixed = {}
    for o in overrides:
        key, _, value = o.partition("=")
        axis = key.strip().removeprefix("mesh.")
        if key.strip().startswith("mesh.") and axis in ("data", "fsdp", "tensor"):
            if value.strip() != "-1":
                fixed[axis] = int(value)
    return fixed


def _compile_isolated(config_name, topo, cfg, hbm: int, program: str) -> dict:
    """In the compiler's own process, as --search compiles: a libtpu crash is one line."""
    from t5lite.tpu import isolated
    try:
        return isolated.shared(program).compile(cfg, topo, hbm_bytes=hbm)
    except isolated.CompilerCrashed as e:
        fix = ("another mesh or remat may compile: `t5lite compile --config "
               f"{config_name} --search` ranks the settings that do") if program == "train" \
            else "another mesh, batch or decode setting may compile"
        raise UserError(f"libtpu's compiler crashed compiling {config_name}'s {program} "
                        f"program for {topo.name} ({e}); {fix}") from None


def compile_command(config_name: str, topology: str, overrides=(), as_json=False,
                    do_search=False, hbm_gib: float = 0.0, decode=False, out=print) -> dict:
    """`t5lite compile`: one report (or a search) for a config on a TPU topology, as JSON
    (one object on stdout) or text."""
    from t5lite.mesh import topology as tpu_topology
    from t5lite.tpu import report, search
    from t5lite import config as config_lib
    cfg = config_lib.load_config(config_name, list(overrides))
    if not (topology or cfg.mesh.topology):
        raise UserError(f"{config_name} states no TPU slice (mesh.topology): give --topology, "
                        "e.g. --topology v5p-8")
    topo = tpu_topology.parse_topology(topology or cfg.mesh.topology)
    tpu_topology.require_libtpu()
    hbm = int(hbm_gib * tpu_topology.GiB) if hbm_gib > 0 else 0
    if decode:
        if do_search:
            raise UserError("--search explores training settings; drop it with --decode")
        r = _compile_isolated(config_name, topo, cfg, hbm, "decode")
        out(json.dumps(r) if as_json else report.format_decode_report(r))
        return r
    if do_search:
        res = search.search(cfg, topo, hbm, log=(lambda s: print(s, file=sys.stderr)) if as_json
                            else out, fixed=_fixed_mesh_axes(overrides))
        if as_json:
            out(json.dumps({k: v for k, v in res.items() if k != "tried"}, default=str))
        elif res["best"]:
            out("fitting, fastest first:")
            for r in res["candidates"]:
                out(f"  {r['expected_step_seconds'] * 1e3:8.2f} ms  expected MFU "
                    f"{r['expected_mfu']:.1%} (bound {r['roofline_mfu']:.1%})  "
                    f"{r['bytes_per_chip']['total'] / tpu_topology.GiB:6.2f} GiB  --set "
                    + " --set ".join(r["set"]))
            out(report.format_report(res["best"]))
        else:
            out(res["why_none"])
        if not as_json:  # (the JSON has them under "crashed")
            for r in res["crashed"]:
                out(f"crashed the compiler, not ranked ({r['crashed']}): --set "
                    + " --set ".join(r["set"]))
        return res
    r = _compile_isolated(config_name, topo, cfg, hbm, "train")
    out(json.dumps(r) if as_json else report.format_report(r))
    if r["mesh_advice"] and not as_json:
        out(r["mesh_advice"])
    return r


# ----------------------------------------------------------------------------- eval, infer


def check_overrides(overrides: Sequence[str]) -> None:
    """A --set key or value that no checkpoint's config can take, as a UserError, with
    nothing heavy imported: `t5lite eval` / `infer` report it before TensorFlow (seconds)
    loads. Keys and types are the schema's, so a default Config gets the same check as the
    checkpoint's config (evaluation.load applies and validates them there)."""
    from t5lite import config as config_lib
    config_lib.apply_overrides(config_lib.Config(), overrides)


def eval_command(checkpoint: str, task: str, split: str = "validation", max_examples: int = 0,
                 overrides: Sequence[str] = ()) -> dict:
    """`t5lite eval`: print a table of the task's metrics for the checkpoint."""
    from t5lite.eval import evaluation
    cfg, model, params = evaluation.load(checkpoint, overrides)
    from t5lite import config as config_lib
    from t5lite.tasks import preflight
    preflight.check_task(task, split, cfg.data.feature_lengths)  # the user's files, lines
    from t5lite.tasks import lengths
    decodes = cfg.model.num_classes <= 0 and cfg.model.architecture != "encoder_only"
    for line in lengths.check([(task, split)], cfg.data.feature_lengths, cfg.data.max_trimmed,
                              config_lib.decode_length(cfg) if decodes else 0):
        print(f"t5lite: {line}", flush=True)
    t0 = time.time()
    metrics = evaluation.evaluate(cfg, model, params, tasks=(task,), split=split,
                                  max_examples=max_examples)
    rows = [("metric", "value")] + [(k, f"{v:.2f}") for k, v in sorted(metrics.items())]
    d = cfg.decode
    how = (f"decode={d.method}" + (f" beams={d.beams} alpha={d.alpha}" if d.method == "beam"
                                   else "")
           + (f" num_samples={d.num_samples}" if d.method == "self_consistency" else "")
           + f" max_length={config_lib.decode_length(cfg)}")
    if cfg.model.num_classes > 0:
        how = "argmax of the classification head"
    print(format_table(rows, header=False))
    print(f"({checkpoint}, split={split}, {how}, {time.time() - t0:.1f}s)")
    return metrics


def fewshot_command(checkpoint: str, task: str, shots: int, split: str = "validation",
                    max_examples: int = 0, template: str = "", label_words: str = "",
                    scoring: str = "rank", context_length: int = 0,
                    overrides: Sequence[str] = (), data_dir: Optional[str] = None) -> dict:
    """`t5lite eval --shots K`: print the in-context accuracy of a checkpoint on a task."""
    from t5lite.eval import evaluation, fewshot
    cfg, model, params = evaluation.load(checkpoint, overrides)
    if cfg.model.architecture == "encoder_only":
        raise UserError("few-shot prompting needs a generative model (GPT / T5), not an "
                        "encoder_only checkpoint.")
    if shots < 0:
        raise UserError(f"--shots must be >= 0, got {shots}.")
    t0 = time.time()
    train = fewshot.read_split(task, "train", data_dir or "")
    examples = fewshot.read_split(task, split, data_dir or "")
    if 0 < max_examples < len(examples):  # a seeded sample: split files may be label-sorted
        keep = np.random.default_rng(cfg.decode.seed).choice(len(examples), max_examples,
                                                             replace=False)
        examples = [examples[i] for i in sorted(keep)]
    words = fewshot.parse_label_words(label_words, fewshot.labels(task, train))
    tmpl = fewshot.get_template(task, template)
    in_vocab, out_vocab, _ = evaluation.io_vocabularies(cfg)
    answer_len = max(len(out_vocab.encode(tmpl.answer.format(label=w))) for w in words.values())
    m = cfg.model
    # the answer (+ EOS) is all that is scored or generated
    max_new_tokens = min(cfg.decode.max_length or answer_len + 2, answer_len + 2)
    length = context_length or max(cfg.data.feature_lengths.values())
    if m.position == "learned":  # decoder-only rows: BOS + prompt + answer
        length = min(length, m.max_length - (m.architecture != "encoder_decoder")
                     * (max_new_tokens + 1))
    from t5lite import config as config_lib
    cfg = config_lib.replace(cfg, {"decode.max_length": max_new_tokens, "data.feature_lengths":
                                   {"inputs": length, "targets": answer_len + 1}})
    predictor = evaluation.Predictor(cfg, model, params, int(out_vocab.eos_id))
    metrics = fewshot.evaluate_fewshot(predictor, in_vocab, out_vocab, task, train, examples,
                                       shots, tmpl, words, scoring, seed=cfg.decode.seed)
    metrics.pop("predictions")
    rows = [("metric", "value")] + [(k, f"{v:.2f}") for k, v in sorted(metrics.items())]
    print(format_table(rows, header=False))
    print(f"({checkpoint}, split={split}, {shots}-shot, scoring={scoring}, "
          f"template={tmpl.prompt!r}, label words={words}, context={length} tokens, "
          f"{len(examples)} examples, {time.time() - t0:.1f}s)")
    return metrics


def _read_lines(path: str) -> list[str]:
    """Non-empty lines of a UTF-8 text file (or stdin); binary or non-UTF-8 input is a
    UserError naming the first bad line."""
    if path == "-":
        stdin = getattr(sys.stdin, "buffer", None)  # a text stream (tests) has none
        data = stdin.read() if stdin is not None else sys.stdin.read().encode("utf-8")
    else:
        if not os.path.exists(path):
            raise UserError(f"--input {path} does not exist.")
        if os.path.isdir(path):
            raise UserError(f"--input {path} is a directory; give a text file, one input per "
                            "line")
        with open(path, "rb") as f:
            data = f.read()
    raw = data.split(b"\n")
    for i, line in enumerate(raw, 1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"--input {path} line {i} is not UTF-8 text (byte "
                            f"{line[e.start]:#04x} at column {e.start + 1}); give a UTF-8 "
                            "text file, one input per line") from None
        if "\x00" in text:
            raise UserError(f"--input {path} line {i} contains NUL bytes: it looks like a "
                            "binary file; give a UTF-8 text file, one input per line")
    lines = data.decode("utf-8").splitlines()
    lines = [x for x in lines if x.strip()]
    if not lines:
        raise UserError(f"--input {path} has no non-empty lines.")
    return lines


def _check_output(path: str) -> None:
    if path == "-":
        return
    if os.path.isdir(path):
        raise UserError(f"--output {path} is a directory; give a file path for the JSONL "
                        f"predictions (e.g. {os.path.join(path, 'predictions.jsonl')})")
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise UserError(f"--output {path}: {parent} is a file, not a directory")


def _check_prefix(cfg, lines: Sequence[str], prefix: str, mode: str) -> None:
    """Warn when the checkpoint's task has a text-to-text prefix (its registry.add_prefix
    step, built-in or the user's) that neither --prefix nor the input lines carry: the model
    never saw inputs without it."""
    from t5lite.tasks import preflight
    known = preflight.text_prefix(cfg.data.mixture_or_task)
    if not known or prefix.strip():
        return
    inputs = [x.split("\t", 1)[0] for x in lines] if mode == "score" else lines
    if any(not x.startswith(known) for x in inputs):
        print(f"t5lite: warning: this checkpoint was finetuned on {cfg.data.mixture_or_task!r}, "
              f"whose inputs start with {known!r}; some input lines do not. Pass --prefix "
              f"{known!r} (or add it to the lines).", file=sys.stderr, flush=True)


def infer_command(checkpoint: str, input_path: str, output_path: str = "-",
                  mode: str = "predict", options: Sequence[str] = (),
                  overrides: Sequence[str] = (), prefix: str = "") -> list[dict]:
    """`t5lite infer`: one JSON line per input line (evaluation.infer's records) to
    ``output_path`` or stdout; ``input_path`` "-" reads stdin."""
    from t5lite.eval import evaluation
    import t5lite.tasks  # noqa: F401
    _check_output(output_path)  # before loading and decoding: a mistake costs nothing
    lines = _read_lines(input_path)
    cfg, model, params = evaluation.load(checkpoint, overrides)
    _check_prefix(cfg, lines, prefix, mode)
    records = evaluation.infer(cfg, model, params, lines, mode, options, prefix)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if output_path == "-":
        sys.stdout.write(text)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
        with open(output_path, "w", encoding="utf-8") as f:
            f.write(text)
    return records


# ----------------------------------------------------------------------------- convert


def import_hf_command(src: str, dst: str) -> None:
    """`t5lite convert import SRC DST`: HF dir -> params-only checkpoint dir."""
    import jax
    from t5lite import convert
    from t5lite.store import checkpointing
    cfg, params, note = convert.import_hf(src)
    checkpointing.save_params_dir(dst, cfg, params)
    n = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    arch = convert.hf_architecture(convert.read_hf_config(src))
    print(f"imported {arch} from {src}: {n:,} params, {cfg.model.architecture} -> {dst} "
          f"(config.json + params/); {note}")


def export_hf_command(src: str, dst: str) -> None:
    """`t5lite convert export SRC DST`: params-only dir / workdir / step dir -> HF dir."""
    from t5lite import convert
    from t5lite import progress
    from t5lite.store import checkpointing
    with progress.quiet_absl():
        cfg, params = checkpointing.load_params(src)
    p = cfg.model.peft
    if p.lora_rank and not (p.prompt_tokens or p.prefix_tokens or p.adapter_dim or p.ia3):
        merged = src.rstrip("/") + "_merged"
        raise UserError(f"{src} is a LoRA run: merge LoRA into the base weights first with "
                        f"`t5lite convert merge-lora {src} {merged}`, then `t5lite convert "
                        f"export {merged} {dst}`.")
    convert.t5lite_to_hf(cfg, params, dst)
    vocab, why = convert.tokenizer_files.find(cfg)
    files = " + ".join(sorted(os.listdir(dst)))
    print(f"exported {src} as {convert.config_to_hf(cfg.model)['architectures'][0]} -> {dst} "
          f"({files}; load with from_pretrained)"
          + (f"; tokenizer: {vocab.name}" if vocab else f"; no tokenizer written: {why}"))


def merge_lora_command(src: str, dst: str) -> None:
    """`t5lite convert merge-lora SRC DST`: a LoRA checkpoint (anything load_params reads) ->
    a params-only checkpoint of the plain model (W + alpha/r A B), usable by export, eval,
    infer and init_from."""
    import jax
    from t5lite import peft
    from t5lite import progress
    from t5lite.store import checkpointing

    with progress.quiet_absl():
        cfg, params = checkpointing.load_params(src)
    mcfg, params = peft.merge_lora(cfg.model, params)
    cfg = dataclasses.replace(cfg, model=mcfg)
    checkpointing.save_params_dir(dst, cfg, jax.tree.map(np.asarray, params))
    print(f"merged LoRA of {src} into the base weights -> {dst} (config.json + params/); "
          f"export it with `t5lite convert export {dst} HF_DIR`")
