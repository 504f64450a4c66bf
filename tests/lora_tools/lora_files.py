"""Small synthetic kohya LoRA files for the toolbox tests (the fixtures are in conftest.py).

Files are built from factors with known singular values (``up = Q1 diag(s)``, ``down = Q2^T``
with orthonormal Q1, Q2), so each module's change has well separated singular values and the
rank rules have no ties. Deltas are recomputed with tests.networks.lora_merge.lora_delta, an
implementation independent of the toolbox.
"""

from __future__ import annotations

from pathlib import Path

import torch

# name -> (out, in, kernel or None for Linear, singular values of up @ down, alpha or None)
# The 1x1 conv is stored 4-d, the 3x3 conv is a LoCon module, the last is a fused FLUX.1-style
# module (an ordinary Linear here).
BASE_MODULES = {
    "lora_te_text_model_encoder_layers_0_mlp_fc1": (
        24,
        16,
        None,
        [9.0, 5.0, 2.0, 1.6, 0.9, 0.4, 0.2, 0.1],
        4.0,
    ),
    "lora_unet_mid_block_attentions_0_proj_in": (
        20,
        12,
        (1, 1),
        [6.0, 5.5, 2.0, 1.0, 0.7, 0.3, 0.05, 0.01],
        None,
    ),
    "lora_unet_down_blocks_0_resnets_0_conv1": (
        7,
        5,
        (3, 3),
        [4.0, 2.2, 0.9, 0.5, 0.25, 0.12],
        1.0,
    ),
    "lora_unet_double_blocks_0_img_attn_qkv": (
        36,
        18,
        None,
        [3.0, 2.9, 2.8, 0.3, 0.2, 0.1, 0.05, 0.02],
        16.0,
    ),
}

BASE_METADATA = {
    "ss_network_module": "networks.lora",
    "ss_network_dim": "8",
    "ss_network_alpha": "4.0",
    "ss_network_args": '{"conv_dim": "6", "conv_alpha": "1.0"}',
    "ss_base_model_version": "sd_v1",
    "ss_v2": "False",
    "ss_training_comment": "fixture run",
    "ss_session_id": "1234567890",
    "ss_output_name": "fixture",
    "ss_tag_frequency": '{"10_cat": {' + ", ".join(f'"tag{i}": {i}' for i in range(60)) + "}}",
    "modelspec.title": "fixture",
    "modelspec.architecture": "stable-diffusion-v1/lora",
    "sshs_model_hash": "stale",
    "sshs_legacy_hash": "stale",
}


def _orthonormal(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(rows, cols, dtype=torch.float64, generator=generator))
    return q


def module_tensors(name, spec, seed: int = 0, shuffle_scale: float = 1.0) -> dict:
    """The kohya tensors of one module with the given singular values of up @ down (spread
    unevenly between up and down, as training leaves them)."""
    out, inp, kernel, values, alpha = spec
    generator = torch.Generator().manual_seed(seed)
    rank = len(values)
    n = inp * (kernel[0] * kernel[1] if kernel else 1)
    s = torch.tensor(values, dtype=torch.float64) * shuffle_scale
    tilt = torch.linspace(0.5, 2.0, rank, dtype=torch.float64)
    up = _orthonormal(out, rank, generator) * s * tilt
    down = _orthonormal(n, rank, generator).T / tilt[:, None]
    tensors = {}
    if kernel:
        tensors[f"{name}.lora_down.weight"] = down.reshape(rank, inp, *kernel).float()
        tensors[f"{name}.lora_up.weight"] = up.reshape(out, rank, 1, 1).float()
    else:
        tensors[f"{name}.lora_down.weight"] = down.float()
        tensors[f"{name}.lora_up.weight"] = up.float()
    if alpha is not None:
        tensors[f"{name}.alpha"] = torch.tensor(alpha)
    return tensors


def save(path: Path, tensors: dict, metadata: dict | None) -> Path:
    """Write tensors exactly as given (no dtype changes) with metadata."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    return path
