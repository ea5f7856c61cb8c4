"""bench/gpu_step.py end to end on CPU with --smoke (tiny presets, 2 rows, 2 steps): t5lite's
side (train step, FLOPs, the params written with t5lite's converter) and HF eager's (those
params, bf16 autocast, AdamW) each in its own subprocess; their first-step losses agree, the
JSON line and the markdown table carry every column; model.attention_kernel is the default
"auto", recorded with what it ran. (torch.compile is left out here: on a CPU
it needs a C++ toolchain and minutes; the GPU run covers it.)"""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_step_smoke(tmp_path):
    out = tmp_path / "smoke.jsonl"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_step.py"), "--smoke",
                           "--cases", "gpt2_small", "--sides", "t5lite,hf_eager",
                           "--out", str(out)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    ours, hf = row["sides"]["t5lite"], row["sides"]["hf_eager"]
    assert "error" not in ours and "error" not in hf, row
    assert abs(ours["loss0"] - hf["loss0"]) < 0.02, (ours["loss0"], hf["loss0"])  # bf16
    for side in (ours, hf):
        assert side["step_s"] > 0 and side["tokens_per_s"] > 0 and side["peak_mib"] > 0
        assert side["mfu"] is None  # a CPU has no peak in the chip table
    # the default "auto" through the config path: xla on a CPU, recorded as what ran
    assert ours["flops"] > 0 and ours["attention_kernel"] == "auto" and ours["attention"] == "xla"
    table = (tmp_path / "smoke.md").read_text()
    assert "| gpt2_small | 2 x 32 | t5lite |" in table and "| hf_eager |" in table
