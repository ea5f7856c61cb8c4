"""Reading an HLO module's text: an instruction's definition and operands, and how many times
a while loop runs (its counter's start, step and bound), shared by the per-instruction costs
(hlo_cost.py) and the step-time replay (step_time.py)."""

from __future__ import annotations

import re

DEF = re.compile(r"\s*(?:ROOT )?%?([\w.\-]+) = (.+?) ([a-z][\w\-]*)\(")


def trip_count(comps, while_line: str, caller: list) -> int:
    """Iterations of an HLO while loop: its condition compares a loop-carried counter (tuple
    element i) against a constant N; the body adds a constant step to element i, and the
    caller's initial tuple holds its start (XLA's collective-matmul loops count 0, 2, 4 ...
    in pairs). ceil((N - start) / step); a loop not of this form: its condition's largest
    integer constant."""
    cond = re.search(r"condition=%?([\w.\-]+)", while_line).group(1)
    body = re.search(r"body=%?([\w.\-]+)", while_line).group(1)
    consts = _constants(comps.get(cond, []))
    index = {}
    for line in comps.get(cond, []):
        d = DEF.match(line)
        if d and d.group(3) == "get-tuple-element":
            index[d.group(1)] = int(re.search(r"index=(\d+)", line).group(1))
    for line in comps.get(cond, []):
        d = DEF.match(line)
        if not d or d.group(3) != "compare":
            continue
        a, b = operands(line, d.end())[:2]
        direction = re.search(r"direction=(\w+)", line).group(1)
        if a in index and b in consts and direction in ("LT", "LE", "NE"):
            i, limit = index[a], consts[b] + (direction == "LE")
        elif b in index and a in consts and direction in ("GT", "GE", "NE"):
            i, limit = index[b], consts[a] + (direction == "GE")
        else:
            continue
        step = _tuple_step(comps.get(body, []), i)
        start = _tuple_start(caller, while_line, i)
        return max(1, -(-(limit - start) // step))
    return max(consts.values(), default=1)  # a counter we cannot trace: its bound


def _constants(lines) -> dict:
    out = {}
    for line in lines:
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = [su](?:8|16|32|64)\[\]\S* constant\((-?\d+)\)",
                     line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def _tuple_step(body: list, i: int) -> int:
    defs = {}
    for line in body:
        d = DEF.match(line)
        if d:
            defs[d.group(1)] = (d.group(3), operands(line, d.end()))
    consts = _constants(body)
    root = next((DEF.match(line) for line in body if line.lstrip().startswith("ROOT")), None)
    if not root or defs[root.group(1)][0] != "tuple" or i >= len(defs[root.group(1)][1]):
        return 1
    kind, ops = defs.get(defs[root.group(1)][1][i], ("", []))
    if kind == "add":
        return next((consts[o] for o in ops if o in consts and consts[o] > 0), 1)
    return 1


def _tuple_start(caller: list, while_line: str, i: int) -> int:
    init = re.search(r" while\(%([\w.\-]+)\)", while_line)
    consts = _constants(caller)
    for line in caller:
        d = DEF.match(line)
        if d and init and d.group(1) == init.group(1) and d.group(3) == "tuple":
            ops = operands(line, d.end())
            return consts.get(ops[i], 0) if i < len(ops) else 0
    return 0


def operands(line: str, op_end: int) -> list:
    args = line[op_end:]
    depth, i = 1, 0
    while i < len(args) and depth:  # up to the call's closing parenthesis
        depth += {"(": 1, ")": -1}.get(args[i], 0)
        i += 1
    return re.findall(r"%([\w.\-]+)", args[:i])
