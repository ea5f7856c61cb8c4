"""The text `t5lite compile` prints for a train step's or a decoding program's report, and
the step figures read from a report of any version (`step_figures`)."""

from __future__ import annotations

from t5lite.mesh.topology import GiB


def format_report(r: dict) -> str:
    b = r["bytes_per_chip"]
    g = lambda n: f"{n / GiB:.2f} GiB"  # noqa: E731
    mesh = " ".join(f"{k}={v}" for k, v in r["mesh"].items())
    if not r.get("compiled", True):
        return "\n".join([
            f"{r['config']} on {r['topology']} ({r['jax_topology']}, {r['chips']} chips), mesh "
            f"{mesh}, remat={r['remat']}, grad_accum_steps={r['grad_accum_steps']}",
            f"DOES NOT FIT: XLA refused to compile it ({r['xla_error']})",
            f"per chip: params {g(b['params'])} + opt state {g(b['opt_state'])}, total "
            f"{g(b['total'])} (XLA's figure) of {g(r['hbm_bytes_per_chip'])} HBM. Try "
            "--search, or --set model.remat=full / train.grad_accum_steps=K / mesh.fsdp=-1."])
    lines = [
        f"{r['config']} on {r['topology']} ({r['jax_topology']}, {r['chips']} chips), mesh "
        f"{mesh}, remat={r['remat']}, grad_accum_steps={r['grad_accum_steps']}, "
        f"batch {r['batch_size']} ({r['tokens_per_step']} tokens)",
        f"per chip: params {g(b['params'])} + opt state {g(b['opt_state'])} (arguments "
        f"{g(b['arguments'])}), temporaries {g(b['temp'])}, total {g(b['total'])} of "
        f"{g(r['hbm_bytes_per_chip'])} HBM",
        ("FITS" if r["fits"] else "DOES NOT FIT") + f": headroom {g(r['headroom_bytes'])}",
        f"FLOPs per chip: compiled {r['flops_per_chip']:.3g} (the HLO's matmuls, loops x their "
        f"trip counts; cost_analysis counts {r['cost_analysis_flops_per_chip']:.3g}); model "
        f"{r['model_flops_per_chip']:.3g} (3 x forward matmuls), with remat recompute "
        f"{r['model_flops_with_remat_per_chip']:.3g}" + (
            f"; Pallas kernels {r['kernel_flops_per_chip']:.3g} of the compiled FLOPs, counted "
            "analytically (XLA's cost analysis does not see inside a kernel)"
            if r.get("kernel_flops_per_chip") else ""),
        f"HBM bytes per chip {r['bytes_accessed_per_chip']:.3g} (VMEM-resident operands "
        f"excluded; XLA's cost_analysis, loops scaled: {r['xla_bytes_accessed_per_chip']:.3g})",
        "collectives per chip: " + (", ".join(
            f"{k} {v['count']}x {v['bytes'] / 1e6:.1f} MB" for k, v in
            sorted(r["collectives"].items())) or "none"),
        "roofline bound: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in
                                       r["roofline_seconds"].items())
        + f" -> step >= {r['roofline_step_seconds'] * 1e3:.2f} ms ({r['bound']}-bound), "
        f"MFU <= {r['roofline_mfu']:.1%}",
        expected_line(r),
        f"compiled in {r['compile_seconds']:.0f} s",
    ]
    return "\n".join(lines)


def expected_line(r: dict) -> str:
    """The expected step (step_time.py) and what it adds to the instructions' own time."""
    e, c = r["expected_seconds"], r["expected_collectives"]
    return (f"expected step {r['expected_step_seconds'] * 1e3:.2f} ms: instructions "
            f"{e['compute'] * 1e3:.2f} ms + collectives not hidden behind compute "
            f"{e['exposed_collectives'] * 1e3:.2f} ms (of {e['collectives'] * 1e3:.2f} ms on "
            f"the torus links; {c['async']} async, {c['sync']} blocking), "
            f"{r['expected_tokens_per_s']:.3g} tokens/s, MFU {r['expected_mfu']:.1%}")


def step_figures(r: dict) -> tuple:
    """(expected step seconds, expected MFU) of a report, also from one written before the
    expected figures existed (then its roofline ``est_*`` values, a bound); (None, None) when
    nothing was compiled."""
    for seconds, mfu in (("expected_step_seconds", "expected_mfu"),
                         ("roofline_step_seconds", "roofline_mfu"),
                         ("est_step_seconds", "est_mfu")):
        if r.get(seconds) is not None:
            return r[seconds], r.get(mfu)
    return None, None


def format_decode_report(r: dict) -> str:
    b = r["bytes_per_chip"]
    g = lambda n: f"{n / GiB:.2f} GiB"  # noqa: E731
    return "\n".join([
        f"{r['config']} decoding ({r['method']}, beams {r['beams']}, {r['max_length']} new "
        f"tokens) on {r['topology']} ({r['jax_topology']}, {r['chips']} chips), mesh "
        + " ".join(f"{k}={v}" for k, v in r["mesh"].items())
        + f", batch {r['batch_size']} x {r['input_length']}",
        f"per chip: params {g(b['params'])}, temporaries (KV cache, logits) {g(b['temp'])}, "
        f"total {g(b['total'])} of {g(r['hbm_bytes_per_chip'])} HBM",
        ("FITS" if r["fits"] else "DOES NOT FIT") + f": headroom {g(r['headroom_bytes'])}",
        f"FLOPs per chip: {r['flops_per_chip']:.3g} (the HLO's matmuls, the token loop x its "
        f"trip count; cost_analysis, loops once: {r['cost_analysis_flops_per_chip']:.3g})",
        f"compiled in {r['compile_seconds']:.0f} s"])
