"""A LoRA trains through the CLI from a single-file checkpoint (SD 1.x and SD 2.x 768-v)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from library.models.families.sd.family import SD1, SD2_V
from library.saving.checkpoint_export import write_single_file
from tests.integration.harness import make_images, tensors, train, write_config
from tests.kits.sd.tiny import build_tiny_components

TOKENIZER = Path(__file__).parents[1] / "assets" / "tokenizer"


@pytest.mark.integration
@pytest.mark.parametrize(("name", "family"), [("sd1", SD1), ("sd2-v", SD2_V)])
def test_lora_trains_from_a_single_file(tmp_path, name, family):
    parts = build_tiny_components(name)
    model = write_single_file(
        tmp_path / f"{name}.safetensors",
        parts["unet"],
        parts["vae"],
        [parts["text_encoder"]],
        family,
        torch.float16,  # as released files are; loaded into float32 for training
    )
    images = make_images(tmp_path / "imgs", 2)
    config = write_config(
        tmp_path / "c.toml",
        model,
        images,
        tmp_path / "out",
        max_train_steps=2,
        tokenizer_path=str(TOKENIZER),
    )
    assert train(config) == 0
    lora = tensors(tmp_path / "out" / "run.safetensors")
    ups = [v for k, v in lora.items() if k.endswith("lora_up.weight")]
    assert ups and any(v.abs().sum() > 0 for v in ups)  # 2 steps moved the zero-initialised ups
    assert any(k.startswith("lora_unet_down_blocks_0_attentions_0") for k in lora)
