"""Wan 2.2 I2V-A14B from its diffusers folder (WanImageToVideoPipeline: two experts of 36 input
channels, no image encoder): the folder loads what the pipeline loads, and the micro-batch loss
on clips of F > 1 frames equals the one written from the pipeline's parts, the condition built
by the pipeline's own prepare_latents from the clip's first frame."""

from __future__ import annotations

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.experts import HIGH_NOISE, LOW_NOISE
from library.models.loader import load_components
from library.training.step import micro_batch_loss
from tests.kits.wan.kit import reference_loss
from tests.kits.wan.tiny import write_tiny_wan_experts_folder, write_tiny_wan_i2v_folder
from tests.kits.wan.tiny_files import write_tiny_wan_expert_file, write_tiny_wan_files
from tests.models.step_inputs import step_inputs
from tests.models.wan.test_wan_clips import _batch

SEED = 11


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_wan_i2v_folder(tmp_path_factory.mktemp("models") / "i2v")


@pytest.fixture(scope="module")
def pipe(folder):
    from diffusers import WanImageToVideoPipeline

    pipe = WanImageToVideoPipeline.from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _load(folder, **flow):
    model = ModelSection(pretrained_model_name_or_path=str(folder))
    return load_components(model, torch.float32, FlowSection(**flow))


def test_the_folder_loads_what_the_image_to_video_pipeline_loads(folder, pipe):
    components = _load(folder)
    assert components.family.FIRST_FRAME_CONDITION
    experts = components.experts
    assert experts.boundary_ratio == pipe.config.boundary_ratio == 0.9
    pairs = ((experts.modules[HIGH_NOISE], pipe.transformer),
             (experts.modules[LOW_NOISE], pipe.transformer_2), (components.vae, pipe.vae))  # fmt: skip
    for ours, theirs in pairs:
        expected, got = theirs.state_dict(), ours.state_dict()
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_single_files_are_musubi_tuners_dit_and_dit_high_noise(folder, pipe, tmp_path):
    """ComfyUI's expert files (the original names) as musubi-tuner takes them: dit the
    low-noise expert, dit_high_noise the high-noise one, split at its I2V-A14B boundary 0.9."""
    files = write_tiny_wan_files(tmp_path / "f")
    low = write_tiny_wan_expert_file(folder, "transformer_2", tmp_path / "low.safetensors")
    high = write_tiny_wan_expert_file(folder, "transformer", tmp_path / "high.safetensors")
    model = ModelSection(pretrained_model_name_or_path=str(low), vae=str(files["vae"]))
    flow = FlowSection(t5=str(files["t5"]), t5_tokenizer_path=str(files["tokenizer"]),
                       dit_high_noise=str(high))  # fmt: skip
    components = load_components(model, torch.float32, flow)
    assert components.family.FIRST_FRAME_CONDITION and components.experts.boundary_ratio == 0.9
    for ours, theirs in ((components.experts.modules[HIGH_NOISE], pipe.transformer),
                         (components.experts.modules[LOW_NOISE], pipe.transformer_2)):  # fmt: skip
        expected = theirs.state_dict()
        assert all(torch.equal(ours.state_dict()[k], expected[k]) for k in expected)


def test_the_task_word_is_checked_against_the_input_channels(folder, tmp_path):
    with pytest.raises(ModelError, match="task = 't2v-A14B' and .* takes 36 input channels"):
        _load(folder, task="t2v-A14B")
    t2v = write_tiny_wan_experts_folder(tmp_path / "t2v")
    with pytest.raises(ModelError, match="task = 'i2v-A14B' and .* takes 16 input channels"):
        _load(t2v, task="i2v-A14B")


def _pipeline_condition(pipe, pixels) -> torch.Tensor:
    """WanImageToVideoPipeline.prepare_latents' condition of each clip's first frame."""
    frames, height, width = pixels.shape[2:]
    rows = []
    for clip in pixels:
        _, condition = pipe.prepare_latents(
            clip[:, 0][None], 1, 16, height, width, frames, torch.float32, torch.device("cpu"),
            latents=torch.zeros(1),
        )  # fmt: skip
        rows.append(condition)
    return torch.cat(rows)


def _text_pipe(pipe):
    """A WanPipeline of the same parts, for its prompt encoding: the pinned diffusers'
    image-to-video pipeline cleans prompts with ftfy even where it is not installed."""
    from diffusers import WanPipeline

    parts = ("tokenizer", "text_encoder", "vae", "scheduler", "transformer")
    return WanPipeline(**{name: getattr(pipe, name) for name in parts})


@pytest.mark.parametrize("expert", [LOW_NOISE, HIGH_NOISE])
def test_clip_loss_equals_the_pipelines_parts(folder, pipe, expert):
    components = _load(folder)
    inputs = step_inputs(components, SEED)
    inputs.denoiser = components.experts.modules[expert]
    batch = _batch(5)
    theirs = pipe.transformer if expert == HIGH_NOISE else pipe.transformer_2
    with torch.no_grad():
        condition = _pipeline_condition(pipe, batch["pixel_values"])
        assert condition.shape == (2, 20, 2, 4, 6)  # 4 mask and 16 latent channels, 2 frames
        ours = micro_batch_loss(inputs, batch)
        expected = reference_loss(_text_pipe(pipe), batch, SEED, condition=condition,
                                  transformer=theirs)  # fmt: skip
        other_first = batch["pixel_values"].clone()
        other_first[:, :, 0] = other_first[:, :, 0].flip(0)  # each clip the other's first frame
        swapped = micro_batch_loss(inputs, {**batch, "pixel_values": other_first})
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(ours, swapped)  # the first frame reaches the loss


def assert_sample_equals_pipelines(folder, pipe, tmp_path):
    """Sample a 5-frame clip from a first frame (--i) with the model of ``folder`` and with
    ``pipe`` (a WanImageToVideoPipeline of the same parts) and assert the frames agree to 1/255;
    the components and the prompt, for further checks."""
    import numpy as np
    from PIL import Image

    from library.sampling.generate import check_sampling, sample_images
    from library.sampling.prompts import SamplePrompt
    from tests.sampling.test_sampling_clips import webp_frames

    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (64, 80, 3), dtype=np.uint8)).save(tmp_path / "i.png")
    prompt = SamplePrompt(index=0, prompt="a red cube", negative_prompt="", seed=4, steps=2,
                          scale=5.0, sampler=None, width=80, height=64, frames=5,
                          first_frame=tmp_path / "i.png")  # fmt: skip
    components = _load(folder)
    check_sampling(components, [prompt])
    done = sample_images(components, [prompt], step=0, output_dir=tmp_path, output_name="s")
    ours, _ = webp_frames(done.images[0])
    embeds, negative = _text_pipe(pipe).encode_prompt("a red cube", "", max_sequence_length=512,
                                                      device=torch.device("cpu"))  # fmt: skip
    video = pipe(image=Image.open(tmp_path / "i.png").convert("RGB"), prompt_embeds=embeds,
                 negative_prompt_embeds=negative, width=80, height=64, num_frames=5,
                 num_inference_steps=2, guidance_scale=5.0, output_type="np",
                 generator=torch.Generator().manual_seed(4)).frames[0]  # fmt: skip
    theirs = (video * 255).round().astype(np.int16)
    assert len(ours) == len(theirs) == 5
    assert max(int(np.abs(a - b).max()) for a, b in zip(ours, theirs, strict=True)) <= 1
    return components, prompt


def test_sample_equals_the_image_to_video_pipelines(folder, pipe, tmp_path):
    """A sample prompt with a first frame (--i) and 5 frames: our clip is the pipeline's own
    call with that image, both experts switching at its boundary."""
    from library.sampling.generate import check_sampling
    from library.sampling.prompts import SamplePrompt

    components, prompt = assert_sample_equals_pipelines(folder, pipe, tmp_path)
    without = SamplePrompt(**{**prompt.__dict__, "first_frame": None})
    with pytest.raises(Exception, match="gives no first frame"):
        check_sampling(components, [without])
