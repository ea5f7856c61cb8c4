"""Where two compiled programs' HBM bytes differ: each top-level instruction's bytes
(t5lite.tpu.hlo_cost, loops times their trip counts) filed under where its metadata says it
comes from, both programs side by side, largest difference first.

    python bench/hlo_bytes_diff.py A.hlo B.hlo [--depth fine|mid|coarse] [--top 30] [--json]

The HLO files are `compiled.as_text()` of each program (bench/t5x_anchor.py --dump-hlo writes
t5x's and t5lite's). An instruction is filed by its op_name: the phase (forward: under jvp;
backward: under transpose(jvp); update: the rest, the optimizer and the loss's bookkeeping),
the module path with layer numbers folded (layers_3 -> layers_*) and method scopes dropped
(t5lite's `decoder.run_layers`, t5x's `Transformer.decode`), the jax primitive, and the HLO
instruction kind (fusion, copy, ...): `--depth fine`. `--depth mid` (the default) keeps
the phase, the stack, the layer's part (attention, mlp, norm, embedding, logits / loss),
whether the op is a matmul, and the kind (the two codebases name their einsums and scopes
differently); `--depth coarse` drops the stack and the matmul split.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_OP_NAME = re.compile(r'op_name="([^"]*)"')
PARTS = (("attention", "attention"), ("mlp", "mlp"), ("norm", "norm"), ("embed", "embedding"),
         ("logits", "logits/loss"), ("take_along_axis", "logits/loss"))


def _phase(name: str) -> str:
    if "transpose(jvp(" in name:
        return "backward"
    return "forward" if "jvp(" in name else "update"


def _path(name: str) -> list:
    """op_name's module path: no jit(...) / jvp(...) wrappers, no method scopes, layers_*."""
    parts = []
    for p in name.split("/"):
        if "(" in p or "." in p or not p:
            continue
        parts.append(re.sub(r"^layers_\d+$", "layers_*", p))
    return parts


def category(line: str, kind: str, depth: str = "fine") -> str:
    m = _OP_NAME.search(line)
    name = m.group(1) if m else ""
    path = _path(name)
    part = next((label for key, label in PARTS if key in "/".join(path)), "other")
    if depth == "coarse":
        return f"{_phase(name)} {part} [{kind}]"
    if depth == "mid":
        stack = next((s for s in ("encoder", "decoder") if s in path), "-")
        op = "matmul" if name.endswith("dot_general") else "other"
        return f"{_phase(name)} {stack} {part} {op} [{kind}]"
    return f"{_phase(name)} {'/'.join(path) or '-'} [{kind}]"


def bytes_by(path: str, depth: str) -> tuple[dict, int]:
    from t5lite.tpu import hlo_cost
    with open(path) as f:
        costs = hlo_cost.hlo_costs(f.read(),
                                   category=lambda line, kind: category(line, kind, depth))
    return costs["bytes_by"], costs["bytes"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--depth", choices=("fine", "mid", "coarse"), default="mid")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--json", action="store_true", help="every category as one JSON object")
    args = p.parse_args()
    (a, ta), (b, tb) = bytes_by(args.a, args.depth), bytes_by(args.b, args.depth)
    rows = sorted(set(a) | set(b), key=lambda c: -abs(b.get(c, 0) - a.get(c, 0)))
    if args.json:
        print(json.dumps({"a": args.a, "b": args.b, "total": [ta, tb],
                          "by": {c: [a.get(c, 0), b.get(c, 0)] for c in rows}}))
        return
    print(f"A = {args.a}: {ta / 1e9:.2f} GB\nB = {args.b}: {tb / 1e9:.2f} GB "
          f"(B - A = {(tb - ta) / 1e9:+.2f} GB)\n")
    print(f"{'A GB':>8} {'B GB':>8} {'B - A':>8}  where")
    for c in rows[:args.top]:
        print(f"{a.get(c, 0) / 1e9:8.3f} {b.get(c, 0) / 1e9:8.3f} "
              f"{(b.get(c, 0) - a.get(c, 0)) / 1e9:+8.3f}  {c}")
    rest = rows[args.top:]
    if rest:
        print(f"{sum(a.get(c, 0) for c in rest) / 1e9:8.3f} "
              f"{sum(b.get(c, 0) for c in rest) / 1e9:8.3f} "
              f"{sum(b.get(c, 0) - a.get(c, 0) for c in rest) / 1e9:+8.3f}  "
              f"({len(rest)} more)")


if __name__ == "__main__":
    main()
