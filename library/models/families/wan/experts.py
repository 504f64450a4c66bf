"""Wan 2.2 A14B's two experts (library.models.experts): a WanPipeline folder holds the
high-noise transformer in ``transformer/`` and the low-noise one in ``transformer_2/`` (diffusers'
WanPipeline denoises with ``transformer`` at timesteps >= boundary_ratio x 1000 and with
``transformer_2`` below), the boundary in model_index.json; single files come as musubi-tuner
gives them: ``dit`` (the main file) the low-noise expert, ``dit_high_noise`` the high-noise one,
split at its t2v-A14B boundary."""

from __future__ import annotations

from pathlib import Path

import torch

from library.errors import ModelError
from library.models.experts import HIGH_NOISE, LOW_NOISE, Experts
from library.models.model_files import load_weights, read_json

# musubi-tuner's boundaries of the A14B experts (its wan configs', 875 and 900 of 1000)
T2V_A14B_BOUNDARY = 0.875
I2V_A14B_BOUNDARY = 0.9


def folder_experts(model_dir: Path, transformer, weight_dtype: torch.dtype) -> Experts | None:
    """The folder's experts when its model_index.json names a ``transformer_2`` (None: one
    denoiser, Wan 2.1's folders and TI2V-5B's, whose transformer_2 is null)."""
    index_path = model_dir / "model_index.json"
    if not model_dir.is_dir() or not any(read_json(index_path).get("transformer_2") or ()):
        return None
    from diffusers import WanTransformer3DModel

    low = load_weights(
        WanTransformer3DModel, model_dir, "transformer_2", weight_dtype, "diffusion_pytorch_model"
    )
    low.requires_grad_(False).eval()
    _same_shape(transformer, low, model_dir / "transformer_2")
    ratio = read_json(index_path).get("boundary_ratio")
    return Experts({HIGH_NOISE: transformer, LOW_NOISE: low}, ratio)


def file_experts(high_file: str | None, low, load_main, i2v: bool = False) -> Experts | None:
    """The experts of single files: ``dit_high_noise`` (``high_file``, read by ``load_main``)
    and the main file's ``low`` transformer, split at T2V-A14B's boundary (``i2v``:
    I2V-A14B's); None without dit_high_noise."""
    if high_file is None:
        return None
    path = Path(high_file).expanduser()
    if not path.is_file():
        raise ModelError(
            f"dit_high_noise = {high_file} does not exist; point it at the high-noise expert's "
            "file (wan2.2_t2v_high_noise_14B_fp16.safetensors)"
        )
    high = load_main(path)
    _same_shape(low, high, path)
    boundary = I2V_A14B_BOUNDARY if i2v else T2V_A14B_BOUNDARY
    return Experts({HIGH_NOISE: high, LOW_NOISE: low}, boundary)


def refuse_folder_expert_file(main: Path, high_file: str | None) -> None:
    """ModelError for dit_high_noise beside a diffusers folder (it holds its own experts)."""
    if high_file is not None and main.is_dir():
        raise ModelError(
            f"dit_high_noise = {high_file} names the high-noise expert beside a transformer "
            f"file, and {main} is a diffusers folder (its experts are transformer/ and "
            "transformer_2/); remove dit_high_noise, or point the model at the low-noise "
            "expert's file"
        )


def _same_shape(one, other, source) -> None:
    if dict(one.config) != dict(other.config):
        raise ModelError(
            f"{source} is not a transformer of the other expert's shape; give the two "
            "experts of one Wan 2.2 A14B model"
        )
