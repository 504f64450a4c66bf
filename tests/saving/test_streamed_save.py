"""Full-model saves are written one tensor (FLUX.1 / SD3: one block) at a time: the same file
contents as casting everything and calling safetensors' save_file, without the second copy of the
model in host memory that needs (measured in a fresh process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from library.saving.checkpoint_export import text_tensors, unet_tensors, vae_tensors
from library.saving.streamed import block_groups, save_streamed

ROOT = Path(__file__).resolve().parents[2]


def _same_file(path: Path, reference: Path, metadata: bool = True) -> None:
    """Both files hold the same tensors (names, dtypes, shapes, bytes) and metadata."""
    ours, theirs = load_file(str(path)), load_file(str(reference))
    assert ours.keys() == theirs.keys()
    for key, tensor in theirs.items():
        assert ours[key].dtype == tensor.dtype and torch.equal(ours[key], tensor), key
    with safe_open(str(path), "pt") as a, safe_open(str(reference), "pt") as b:
        assert a.metadata() == b.metadata() or not metadata


def _cast(tensors: dict, dtype: torch.dtype | None) -> dict:
    return {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous()
        for k, v in tensors.items()
    }


@pytest.mark.parametrize("dtype", [None, torch.float16, torch.bfloat16])
def test_any_tensors_as_save_file_writes_them(tmp_path, dtype):
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn(7, 5, generator=generator),
        "a.bias": torch.randn(5, generator=generator, dtype=torch.float64),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "half": torch.randn(3, 2, 2, generator=generator).to(torch.bfloat16),
        "ids": torch.arange(11),  # an integer buffer keeps its dtype
        "mask": torch.tensor([True, False, True]),
        "view": torch.randn(4, 6, generator=generator)[:, ::2],  # not contiguous
    }
    metadata = {"ss_note": "ünïcode", "modelspec.title": "t"}
    reference = tmp_path / "reference.safetensors"
    save_file(_cast(tensors, dtype), str(reference), metadata=metadata)
    half = dict(list(tensors.items())[:3])
    rest = dict(list(tensors.items())[3:])
    path = save_streamed(tmp_path / "streamed.safetensors", [half, rest], metadata, dtype)
    _same_file(path, reference)


def test_a_conversion_runs_per_group(tmp_path):
    # a key-layout conversion that fuses the parts of a block, as FLUX.1's and SD3's do
    def fuse(group):
        out = {}
        for key in sorted(group):
            block, part = key.rsplit(".", 1)
            out.setdefault(f"{block}.qkv", []).append(group[key])
        return {k: torch.cat(v) for k, v in out.items()}

    state = {f"blocks.{b}.{p}": torch.full((2, 3), float(b)) for b in range(3) for p in "kqv"}
    groups = block_groups(state, ("blocks.",))
    assert [sorted(g) for g in groups] == [sorted(k for k in state if f".{b}." in k) for b in range(3)]
    path = save_streamed(tmp_path / "f.safetensors", [(g, fuse) for g in groups])
    reference = tmp_path / "r.safetensors"
    save_file(fuse(state), str(reference))
    _same_file(path, reference)


def test_flux_and_sd3_full_model_files_are_unchanged(tmp_path):
    from library.models.families.flux.original_keys import ae_to_original
    from library.models.families.flux.original_keys import transformer_to_original as flux_original
    from library.models.families.sd3.original_keys import transformer_to_original as sd3_original
    from tests.training.flux_fixtures import tiny_flux_components
    from tests.training.sd3_fixtures import tiny_sd3_components

    flux = tiny_flux_components()
    path = tmp_path / "flux.safetensors"
    flux.family.write_full_model(path, flux.denoiser, flux, {"m": "1"}, torch.bfloat16)
    state = _cast(flux.denoiser.state_dict(), torch.bfloat16)
    config = json.dumps(dict(flux.denoiser.config), default=list, sort_keys=True)
    reference = tmp_path / "flux-reference.safetensors"
    meta = {"difftune.config.transformer": config, "m": "1"}
    save_file(_cast(flux_original(state), None), str(reference), metadata=meta)
    _same_file(path, reference)

    sd3 = tiny_sd3_components()
    path = tmp_path / "sd3.safetensors"
    sd3.family.write_full_model(path, sd3.denoiser, sd3, None, torch.float16)
    state = _cast(sd3.denoiser.state_dict(), torch.float16)
    tensors = {f"model.diffusion_model.{k}": v for k, v in sd3_original(state).items()}
    vae = _cast(sd3.vae.state_dict(), torch.float16)
    tensors |= {f"first_stage_model.{k}": v for k, v in ae_to_original(vae).items()}
    with safe_open(str(path), "pt") as file:
        meta = file.metadata()  # the configs, checked by the SD3 loader's tests
    reference = tmp_path / "sd3-reference.safetensors"
    save_file(_cast(tensors, None), str(reference), metadata=meta)
    _same_file(path, reference)


def test_sd_checkpoint_is_unchanged(tmp_path):
    from library.models.families.sd.checkpoint_layout import LAYOUTS
    from library.models.families.sd.family import family_for
    from library.saving.checkpoint_export import write_single_file
    from tests.kits.sd.tiny import build_tiny_components

    parts = build_tiny_components("sd1")
    family = family_for(v2=False, prediction_type="epsilon")
    unet, vae, text = parts["unet"], parts["vae"], parts["text_encoder"]
    path = write_single_file(tmp_path / "sd.safetensors", unet, vae, [text], family, torch.float16)
    tower = LAYOUTS["sd1"].towers[0]
    tensors = {**unet_tensors(unet), **vae_tensors(vae), **text_tensors(text, tower)}
    with safe_open(str(path), "pt") as file:
        meta = file.metadata()
    reference = tmp_path / "reference.safetensors"
    save_file(_cast(tensors, torch.float16), str(reference), metadata=meta)
    _same_file(path, reference)


@pytest.mark.subprocess
def test_a_full_model_save_holds_no_second_copy_of_the_model(tmp_path):
    probe = ROOT / "tests" / "saving" / "save_memory_probe.py"
    done = subprocess.run(
        [sys.executable, str(probe), str(tmp_path)], capture_output=True, text=True, check=True,
        env={"OMP_NUM_THREADS": "1", "PATH": ""},
    )  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    streamed, eager = found["streamed"], found["eager"]
    # built without a spike: before the first save the peak is what the process holds
    assert found["peak_built"] - streamed["rss"] < found["model"] // 20
    bf16 = found["model"] // 2  # the file's tensors
    # ours: about one block more than the model itself
    assert streamed["peak"] - max(found["peak_built"], streamed["rss"]) < 0.25 * bf16
    # a plain save holds the whole cast model at once (the peak grows past the streamed one's)
    assert eager["peak"] - eager["rss"] > 0.9 * bf16
    # the same tensors (the plain save writes no header metadata)
    _same_file(tmp_path / "streamed.safetensors", tmp_path / "eager.safetensors", metadata=False)
