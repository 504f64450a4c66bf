"""Wan 2.1 I2V-14B from its diffusers folder (WanImageToVideoPipeline: one transformer of 36
input channels reading CLIP image states, a CLIPVisionModel in image_encoder/ and its
CLIPImageProcessor): the folder loads what the pipeline loads, and the micro-batch loss on clips
of F > 1 frames equals the one written from the pipeline's parts (its prepare_latents'
condition and its encode_image's states of each clip's first frame); a sample is the pipeline's
own call."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.loader import load_components
from library.training.step import micro_batch_loss
from tests.kits.wan.kit import reference_loss
from tests.kits.wan.tiny import (
    clip_vision_config,
    write_tiny_wan_i2v_clip_folder,
    write_tiny_wan_i2v_folder,
)
from tests.kits.wan.tiny_files import write_tiny_wan_clip_pth, write_tiny_wan_i2v_clip_files
from tests.models.step_inputs import step_inputs
from tests.models.wan.test_wan_clips import _batch
from tests.models.wan.test_wan_i2v import (
    _load,
    _pipeline_condition,
    _text_pipe,
    assert_sample_equals_pipelines,
)

SEED = 11


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_wan_i2v_clip_folder(tmp_path_factory.mktemp("models") / "i2v14")


@pytest.fixture(scope="module")
def pipe(folder):
    from diffusers import WanImageToVideoPipeline

    pipe = WanImageToVideoPipeline.from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _same(ours, theirs) -> None:
    expected, got = theirs.state_dict(), ours.state_dict()
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_the_folder_loads_what_the_image_to_video_pipeline_loads(folder, pipe):
    components = _load(folder)
    assert components.family.FIRST_FRAME_CONDITION and components.experts is None
    _same(components.denoiser, pipe.transformer)
    _same(components.image_encoder.model, pipe.image_encoder)
    assert components.image_encoder.processor.to_dict() == pipe.image_processor.to_dict()


def test_the_task_word_and_the_image_encoder_are_checked(folder, tmp_path):
    with pytest.raises(ModelError, match="task = 'i2v-A14B' and .* reads CLIP image states"):
        _load(folder, task="i2v-A14B")
    a14b = write_tiny_wan_i2v_folder(tmp_path / "a14b")
    with pytest.raises(ModelError, match="task = 'i2v-14B' and .* takes no CLIP image states"):
        _load(a14b, task="i2v-14B")
    with pytest.raises(ModelError, match="clip is set and .* reads no CLIP image states"):
        _load(a14b, clip=str(tmp_path / "clip_vision_h.safetensors"))


def _eight_bit_batch(frames: int) -> tuple[dict, np.ndarray]:
    """_batch's clips on the 8-bit grid the data path gives (x / 127.5 - 1), with the 8-bit
    first frames [B, H, W, 3]."""
    batch = _batch(frames)
    levels = ((batch["pixel_values"] + 1) * 127.5).round()
    firsts = levels[:, :, 0].permute(0, 2, 3, 1).to(torch.uint8).numpy()
    return {**batch, "pixel_values": levels / 127.5 - 1}, firsts


def test_clip_loss_equals_the_pipelines_parts(folder, pipe):
    components = _load(folder)
    inputs = step_inputs(components, SEED)
    batch, firsts = _eight_bit_batch(5)
    with torch.no_grad():
        condition = _pipeline_condition(pipe, batch["pixel_values"])
        embeds = torch.cat([pipe.encode_image(Image.fromarray(f), torch.device("cpu"))
                            for f in firsts])  # fmt: skip
        assert embeds.shape == (2, 5, 16)  # the class token and 4 patches, penultimate layer
        ours = micro_batch_loss(inputs, batch)
        expected = reference_loss(_text_pipe(pipe), batch, SEED, condition=condition,
                                  transformer=pipe.transformer, image_embeds=embeds)  # fmt: skip
        foreign = reference_loss(_text_pipe(pipe), batch, SEED, condition=condition,
                                 transformer=pipe.transformer, image_embeds=embeds.flip(0))  # fmt: skip
        other = batch["pixel_values"].clone()
        other[:, :, 0, :, :24] = other[:, :, 0, :, :24].flip(0)  # half of each first frame swapped
        swapped = micro_batch_loss(inputs, {**batch, "pixel_values": other})
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(ours, swapped)
    assert not torch.allclose(ours, foreign)  # each clip's own CLIP states reach the loss


def test_sample_equals_the_image_to_video_pipelines(folder, pipe, tmp_path):
    """A sample prompt with a first frame (--i) and 5 frames: our clip is the pipeline's own
    call with that image, its CLIP states from the pipeline's encode_image."""
    assert_sample_equals_pipelines(folder, pipe, tmp_path)

def test_single_files_are_musubi_tuners_dit_and_clip(folder, pipe, tmp_path):
    """ComfyUI's files as musubi-tuner takes them: the transformer in the original names (dit)
    and Comfy-Org's clip_vision_h layout (clip: transformers' names and a projection the states
    do not use); the CLIP preprocessing is the released one."""
    from library.models.image_encoders.clip_vision import CLIP_PROCESSOR

    files = write_tiny_wan_i2v_clip_files(folder, tmp_path / "f")
    model = ModelSection(pretrained_model_name_or_path=str(files["transformer"]),
                         vae=str(files["vae"]))  # fmt: skip
    flow = {"t5": str(files["t5"]), "t5_tokenizer_path": str(files["tokenizer"])}
    with pytest.raises(ModelError, match="needs Wan 2.1 I2V-14B's CLIP vision encoder"):
        load_components(model, torch.float32, FlowSection(**flow))
    components = load_components(model, torch.float32, FlowSection(clip=str(files["clip"]), **flow))
    assert components.family.FIRST_FRAME_CONDITION
    _same(components.denoiser, pipe.transformer)
    _same(components.image_encoder.model, pipe.image_encoder)
    processor = components.image_encoder.processor.to_dict()
    assert processor["crop_size"] == CLIP_PROCESSOR["crop_size"] == {"height": 224, "width": 224}
    with pytest.raises(ModelError, match=r"clip = .* is not Wan 2.1 I2V-14B's CLIP"):
        load_components(model, torch.float32, FlowSection(clip=str(files["t5"]), **flow))


def test_wan_ais_clip_file_gives_its_visual_tower(folder, pipe, tmp_path):
    """Wan-AI's models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth as clip: its visual
    tower (Wan's own names, q/k/v fused) is the folder's CLIP vision encoder, the text tower and
    the pooling head left out (the file carries no config: its sizes come from its shapes)."""
    files = write_tiny_wan_i2v_clip_files(folder, tmp_path / "f")
    pth = write_tiny_wan_clip_pth(folder, tmp_path / "models_clip_open-clip-xlm-roberta.pth")
    flow = FlowSection(clip=str(pth), t5=str(files["t5"]),
                       t5_tokenizer_path=str(files["tokenizer"]))  # fmt: skip
    model = ModelSection(pretrained_model_name_or_path=str(files["transformer"]),
                         vae=str(files["vae"]))  # fmt: skip
    components = load_components(model, torch.float32, flow)
    _same(components.image_encoder.model, pipe.image_encoder)


def test_a_full_fine_tune_is_written_in_the_original_names_and_reloads(folder, tmp_path):
    """The whole transformer in the original names of Wan 2.1 I2V-14B's files (its image
    input: img_emb, cross_attn.k_img / v_img / norm_k_img), read back as the model."""
    from safetensors import safe_open

    from library.models.families.spec_loader import load_main_file
    from library.models.families.wan import spec

    components = _load(folder)
    path = tmp_path / "full.safetensors"
    components.family.write_full_model(path, components.denoiser, components, {}, torch.float32)
    with safe_open(str(path), "pt") as f:
        keys = set(f.keys())
    assert {"img_emb.proj.1.weight", "blocks.0.cross_attn.k_img.weight",
            "blocks.1.cross_attn.norm_k_img.weight"} <= keys  # fmt: skip
    _same(load_main_file(spec.SPEC_I2V_CLIP, path, torch.float32), components.denoiser)


def test_a_folder_without_its_encoder_or_with_another_width_is_refused(folder, tmp_path):
    """Before any weight is read: an I2V-14B folder whose model_index.json names no image
    encoder, and a clip file whose states are not the transformer's image input's width."""
    import json
    import shutil

    from safetensors.torch import save_file
    from transformers import CLIPVisionConfig, CLIPVisionModel

    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    index = json.loads((bare / "model_index.json").read_text())
    index["image_encoder"] = index["image_processor"] = [None, None]
    (bare / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ModelError, match="reads CLIP image states, and .* gives no CLIP vision"):
        _load(bare)
    wide = CLIPVisionModel(CLIPVisionConfig(**{**clip_vision_config(), "hidden_size": 24}))
    path = tmp_path / "clip_wide.safetensors"
    save_file({f"vision_model.{k}": v.contiguous() for k, v in wide.state_dict().items()},
              str(path))  # fmt: skip
    with pytest.raises(ModelError, match=r"gives 24-wide image states .* reads 16-wide ones"):
        _load(folder, clip=str(path))
