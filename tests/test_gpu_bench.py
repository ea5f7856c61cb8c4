"""bench/gpu_step.py end to end on CPU with --smoke (tiny presets, 2 rows, 2 steps): t5lite's
side (train step, FLOPs, the params written with t5lite's converter) and HF eager's (those
params, bf16 autocast, AdamW) each in its own subprocess; their first-step losses agree, the
JSON line and the markdown table carry every column. The run asks for
model.attention_kernel="cudnn", which a CPU refuses: the row is xla's and says so; --set
changes t5lite's config (an experiment, recorded in the row). --trace
profiles t5lite's side (bench/gpu_profile.py's summary of a jax.profiler trace, XLA's optimized
HLO beside it). (torch.compile is left out here: on a CPU it needs a C++ toolchain and minutes;
the GPU run covers it.)"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import gpu_profile  # noqa: E402


def test_gpu_step_smoke(tmp_path):
    out = tmp_path / "smoke.jsonl"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_step.py"), "--smoke",
                           "--cases", "gpt2_small", "--sides", "t5lite,hf_eager",
                           "--attention-kernel", "cudnn", "--set", "model.scan_unroll=0",
                           "--trace", "gpt2_small",
                           "--trace-dir", str(tmp_path / "trace"), "--failures",
                           str(tmp_path / "failures.txt"), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    ours, hf = row["sides"]["t5lite"], row["sides"]["hf_eager"]
    assert "error" not in ours and "error" not in hf, row
    assert abs(ours["loss0"] - hf["loss0"]) < 0.02, (ours["loss0"], hf["loss0"])  # bf16
    for side in (ours, hf):
        assert side["step_s"] > 0 and side["tokens_per_s"] > 0 and side["peak_mib"] > 0
        assert side["mfu"] is None  # a CPU has no peak in the chip table
    # cuDNN refused on a CPU: the side ran again with xla, and the row says why
    assert ours["flops"] > 0 and ours["attention_kernel"] == "xla" and ours["attention"] == "xla"
    assert ours["instead_of"].startswith("cudnn: ") and "CUDA GPU" in ours["instead_of"]
    assert "model.attention_kernel='cudnn'" in (tmp_path / "failures.txt").read_text()
    table = (tmp_path / "smoke.md").read_text()
    assert "| gpt2_small | 2 x 32 | t5lite --set model.scan_unroll=0 |" in table
    assert "| hf_eager |" in table and row["set"] == ["model.scan_unroll=0"]
    assert "xla (cudnn: " in table
    # the profile: XLA:CPU's ops stand in for a GPU's kernels
    summary = json.loads((tmp_path / "trace" / "profile.json").read_text())
    assert ours["profile"]["kernel_ms"] == pytest.approx(summary["kernel_ms_per_step"])
    assert summary["kernel_ms_per_step"] > 0 and summary["steps"] == 3
    assert sum(summary["classes"].values()) == pytest.approx(summary["kernel_ms_per_step"],
                                                             rel=1e-3)
    assert summary["classes"].get("matmul", 0) > 0  # GPT-2's dots
    dumped = os.listdir(tmp_path / "trace" / "hlo")
    assert any(f.endswith("jit_step_fn.cpu_after_optimizations.txt") for f in dumped), dumped


@pytest.mark.parametrize("name,cls", [
    # kernel names as CUPTI reports them on Hopper (cuBLAS, cuBLASLt's nvjet, cuDNN's fused
    # attention, XLA's fusions and Triton GEMMs), and t5lite's own Pallas kernels
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas", "matmul"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("gemm_fusion_dot_123", "matmul"),
    ("cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0", "attention"),
    ("flash_gpu_dkv_kernel", "attention"),
    ("loop_multiply_fusion_3", "fusion"),
    ("input_reduce_fusion_12", "fusion"),
    ("memcpy32_post", "copy"),
    ("rng_bit_generator", "other"),
])
def test_gpu_profile_classes(name, cls):
    assert gpu_profile.kernel_class(name, "") == cls
