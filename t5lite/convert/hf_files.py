"""Reading and writing Hugging Face model dirs: config.json and the weights (model.safetensors,
pytorch_model.bin, or either sharded behind an index). Only local files: nothing here touches
the network."""

from __future__ import annotations

import json
import os

import numpy as np

from t5lite.errors import UserError


def read_hf_dir(hf_dir: str) -> tuple[dict, dict]:
    """-> (config.json as a dict, {tensor name: float32 numpy array}) from a local HF dir."""
    if not os.path.isdir(hf_dir):
        raise UserError(f"{hf_dir} is not a directory; pass a local Hugging Face model dir "
                        "(config.json + model.safetensors). Hub names are not downloaded: "
                        "fetch the model first, e.g. with `hf download NAME --local-dir DIR`.")
    cfg_path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(cfg_path):
        raise UserError(f"{hf_dir} has no config.json; it must be a Hugging Face model dir "
                        "written by save_pretrained (config.json + model.safetensors).")
    return read_hf_config(hf_dir), _read_tensors(hf_dir)


def read_hf_config(hf_dir: str) -> dict:
    path = os.path.join(hf_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            hf_cfg = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise UserError(f"{path} is not valid JSON ({e}); it must be the config.json that "
                        "save_pretrained wrote") from None
    if not isinstance(hf_cfg, dict):
        raise UserError(f"{path} holds a JSON {type(hf_cfg).__name__}, not an object; it must "
                        "be the config.json that save_pretrained wrote")
    return hf_cfg


def write_hf_dir(hf_cfg: dict, tensors: dict, out_dir: str) -> str:
    """``out_dir/model.safetensors`` + ``config.json``, as from_pretrained reads them."""
    from safetensors.numpy import save_file

    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_cfg, f, indent=2, sort_keys=True)
    return out_dir


def _read_tensors(hf_dir: str) -> dict:
    files = set(os.listdir(hf_dir))
    for index, fmt in (("model.safetensors.index.json", "safetensors"),
                       ("pytorch_model.bin.index.json", "torch")):
        if index in files:  # sharded checkpoint
            try:
                with open(os.path.join(hf_dir, index)) as f:
                    shards = sorted(set(json.load(f)["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise UserError(f"{os.path.join(hf_dir, index)} is malformed ({type(e).__name__}:"
                                f" {e}); it must be JSON with a weight_map") from None
            out = {}
            for shard in shards:
                out.update(_read_file(os.path.join(hf_dir, shard), fmt))
            return out
    if "model.safetensors" in files:
        return _read_file(os.path.join(hf_dir, "model.safetensors"), "safetensors")
    if "pytorch_model.bin" in files:
        return _read_file(os.path.join(hf_dir, "pytorch_model.bin"), "torch")
    raise UserError(f"{hf_dir} has no weights: expected model.safetensors or pytorch_model.bin "
                    f"(found {', '.join(sorted(files)) or 'nothing'}). TF / Flax weights: load "
                    "them in transformers and save_pretrained(..., safe_serialization=True).")


def _read_file(path: str, fmt: str) -> dict:
    if not os.path.isfile(path):
        raise UserError(f"weights file {path} is missing; re-save the model with "
                        "save_pretrained")
    try:
        return _read_weights(path, fmt)
    except (UserError, ImportError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - truncated, garbage, wrong format ...
        first = (str(e).splitlines() or [""])[0][:160]
        raise UserError(f"{path} is not a readable {fmt} weights file ({type(e).__name__}: "
                        f"{first}); re-download it or re-save the model with "
                        "save_pretrained") from None


def _read_weights(path: str, fmt: str) -> dict:
    if fmt == "torch":
        try:
            import torch
        except ImportError as e:
            raise UserError(f"reading {path} needs PyTorch; `pip install torch` or convert it to "
                            "model.safetensors with transformers first.") from e
        state = torch.load(path, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    from safetensors import safe_open
    out = {}
    with safe_open(path, framework="numpy") as f:
        names = list(f.keys())
        bf16 = [n for n in names if f.get_slice(n).get_dtype() == "BF16"]
        for n in names:
            if n not in bf16:
                out[n] = np.asarray(f.get_tensor(n), np.float32)
    if bf16:  # numpy has no bfloat16: read those through jax (ml_dtypes) on the CPU
        import jax
        with jax.default_device(jax.devices("cpu")[0]), safe_open(path, framework="flax") as f:
            for n in bf16:
                out[n] = np.asarray(f.get_tensor(n), np.float32)
    return out
