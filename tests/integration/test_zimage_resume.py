"""Z-Image LoRA, as FLUX.1's and SD3's (check_accumulation_and_resume): 4 samples per step as one
batch of 4, as 2 x 2 accumulated, and from a run stopped right after its step-1 save and
resumed, all the same weights. The four captions are four lengths, so the batch of 4 pads them
to the longest while the micro-batches of 2 pad less (TextConditioning.lengths cuts each back).
tests/distributed proves the same over processes (modes zimage-lora and zimage-fsdp)."""

from __future__ import annotations

import pytest

from tests.integration.harness import check_accumulation_and_resume, make_images, write_config

ZIMAGE = {
    "network_module": "networks.lora_zimage",
    "network_train_unet_only": True,
    "bucket_reso_steps": 16,
    # Adam's first updates follow the gradient rather than its sign (tests/distributed does
    # the same), so the comparison checks the gradients
    "optimizer_args": ["eps=1e-3"],
}
CAPTIONS = (
    "red",
    "a photo of shape number 1",
    "a photo of shape number 2 on a gradient, centred in the frame",
    "a much longer caption of shape number three, a coloured square on a soft gradient of warm "
    "and cool tones, photographed from above in even daylight",
)


@pytest.fixture(scope="module")
def zimage_dir(kit_folders):
    """The session's tiny kit folder (zimage turbo, seed 0): read only."""
    return kit_folders("zimage", "turbo")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = make_images(tmp_path_factory.mktemp("data") / "imgs", len(CAPTIONS), size=64)
    for caption, image in zip(CAPTIONS, sorted(folder.glob("*.png")), strict=True):
        image.with_suffix(".txt").write_text(caption, encoding="utf-8")
    return folder


def test_accumulation_and_resume_train_the_same_lora(tmp_path, zimage_dir, images, monkeypatch):
    def make_config(folder, out, **keys):
        return write_config(folder / "c.toml", zimage_dir, images, out, **{**ZIMAGE, **keys})

    common = {"max_train_steps": 2, "train_batch_size": 4}
    check_accumulation_and_resume(tmp_path, make_config, common, monkeypatch)
