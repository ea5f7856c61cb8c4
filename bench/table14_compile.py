"""T5's Table 14 rows compiled for a TPU slice, stage by stage: each distinct train step of a
row in its own `t5lite compile --json` process (one estimate process holding a row's three
programs outgrew a 24 GB host at Large), appended as JSON lines that
`t5lite ablate --table table14 --scale paper --estimate --topology SLICE --compiled FILE`
reads instead of compiling (the same --set flags).

    python bench/table14_compile.py large v5p-128    # -> bench/table14_compile.jsonl
"""

import json
import os
import subprocess
import sys

from t5lite import ablations
from t5lite.ablations import estimation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# pretraining over every chip with full remat; finetuning 8-way fsdp (GLUE / SuperGLUE's
# batch of 8) and the rest tensor-parallel (bench/RESULTS.md, "T5's Table 14")
SETS = ["mesh.data=1", "mesh.fsdp=-1", "model.remat=full", "finetune.mesh.fsdp=8",
        "finetune.mesh.tensor=-1"]


def main(row: str, topology: str, out: str) -> None:
    table = ablations.load_table("table14")
    stages = ablations.plan.row_training_stages(table, table.row(row), "/estimate",
                                                ablations.PAPER_TASKS, "paper", SETS)
    seen = set()
    for st in stages:
        key = estimation.step_key(st.cfg)
        if key in seen:
            continue
        seen.add(key)
        cmd = [sys.executable, "-m", "t5lite.cli", "compile", "--config",
               f"configs/{st.config}.py", "--topology", topology, "--json"]
        cmd += [a for o in st.overrides for a in ("--set", o)]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode:
            print(f"{st.workdir}: failed: {r.stderr.strip().splitlines()[-1:]}", flush=True)
            continue
        rep = json.loads(r.stdout.strip().splitlines()[-1])
        line = {"row": row, "stage": st.task or st.kind, "topology": topology, "extra": [],
                "config": st.config, "overrides": st.overrides, "fits": rep["fits"],
                "chips": rep["chips"], "expected_step_seconds": rep.get("expected_step_seconds"),
                "roofline_step_seconds": rep.get("roofline_step_seconds"),
                "peak_gib_per_chip": rep["bytes_per_chip"]["total"] / 2 ** 30}
        with open(out, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(f"{st.workdir}: {line['peak_gib_per_chip']:.2f} GiB a chip, "
              f"{line['expected_step_seconds']:.4f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else
         os.path.join(ROOT, "bench", "table14_compile.jsonl"))
