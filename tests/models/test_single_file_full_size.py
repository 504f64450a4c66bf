"""Full-size SD 1.5 / 2.x / SDXL architectures, built from the shipped configs: what our exporter
writes is exactly what the single-file loader reads, every key used, with the shipped configs.

The CI variant works on the meta device (names and shapes, no weights); the slow one writes and
reads a real SD 1.5 file with random weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from library.models.checkpoint_file import CheckpointFile
from library.models.checkpoint_parts import plan_components
from library.models.families.sd.checkpoint_layout import CONFIGS_DIR, LAYOUTS
from library.saving.checkpoint_export import text_tensors, unet_tensors, vae_tensors

TOKENIZER = Path(__file__).parents[1] / "assets" / "tokenizer"


def build(folder: str, layout: str, device: str = "meta"):
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    def config(name: str) -> dict:
        return json.loads((CONFIGS_DIR / folder / f"{name}.json").read_text())

    with torch.device(device):
        unet = UNet2DConditionModel.from_config(config("unet"))
        vae = AutoencoderKL.from_config(config("vae"))
        encoders = []
        for tower in LAYOUTS[layout].towers:
            cls = CLIPTextModelWithProjection if tower.with_projection else CLIPTextModel
            encoders.append(cls(CLIPTextConfig(**config(tower.subfolder))))
    return unet, vae, encoders


# Tensors per component in the original layout, counted by hand from the released files:
# SD 1.5's UNet 686, VAE 248, CLIP-L 12 layers x 16 + 4 = 196 (the released file has 1131 keys,
# these plus position_ids); OpenCLIP blocks hold 12 tensors: SD 2.x 24 blocks + 4 = 292, SDXL's
# bigG 32 blocks + 5 (with text_projection) = 389; SDXL's UNet 1680.
CASES = [
    ("sd15", "sd1", [686, 248, 196]),
    ("sd2-768-v", "sd2", [686, 248, 292]),
    ("sdxl-base", "sdxl", [1680, 248, 196, 389]),
]


@pytest.mark.parametrize(("folder", "layout", "counts"), CASES)
def test_export_fits_the_shipped_configs_with_every_key_used(folder, layout, counts):
    unet, vae, encoders = build(folder, layout)
    parts = [unet_tensors(unet), vae_tensors(vae)]
    parts += [text_tensors(e, t) for e, t in zip(encoders, LAYOUTS[layout].towers, strict=True)]
    assert [len(p) for p in parts] == counts
    tensors = {k: v for part in parts for k, v in part.items()}
    file = CheckpointFile(Path(f"{folder}.safetensors"), tensors=tensors)
    plans = plan_components(file, LAYOUTS[layout].towers, CONFIGS_DIR / folder)
    assert [p.source for p in plans] == ["shipped"] * len(plans)
    used = {k for p in plans for k in p.keys}
    unused = set(tensors) - used
    if layout == "sd2":
        # Only the extra OpenCLIP block SD 2.x never runs (it conditions on the penultimate).
        assert unused == {k for k in tensors if ".transformer.resblocks.23." in k}
        assert len(unused) == 12
    else:
        assert unused == set()


@pytest.mark.slow
def test_full_size_sd15_file_round_trip(tmp_path):
    from library.config.schema import ModelSection
    from library.models.families.sd.family import SD1
    from library.models.loader import load_components
    from library.saving.checkpoint_export import write_single_file

    unet, vae, (encoder,) = build("sd15", "sd1")
    torch.manual_seed(0)
    for module in (unet, vae, encoder):
        module.to_empty(device="cpu")
        for tensor in module.state_dict().values():
            tensor.normal_(0, 0.02)
        module.half()
    path = write_single_file(
        tmp_path / "sd15.safetensors", unet, vae, [encoder], SD1, torch.float16
    )
    file = CheckpointFile(path)
    plans = plan_components(file, LAYOUTS["sd1"].towers, CONFIGS_DIR / "sd15")
    assert {k for p in plans for k in p.keys} == set(file.keys())
    model = ModelSection(pretrained_model_name_or_path=str(path), tokenizer_path=str(TOKENIZER))
    loaded = load_components(model, torch.float16)
    for want, got in ((unet, loaded.denoiser), (vae, loaded.vae), (encoder, loaded.text_encoder)):
        a, b = want.state_dict(), got.state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
