"""Wan 2.2 TI2V-5B trained as text to video from its diffusers folder: the folder loads what
WanPipeline loads (the Wan 2.2 VAE's 48 channels, per-token timesteps), the micro-batch loss on
clips of F > 1 frames equals the one written from the pipeline's parts, and a sample equals
WanPipeline's own."""

from __future__ import annotations

import json

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.loader import load_components
from library.training.step import micro_batch_loss
from tests.kits.wan.kit import reference_loss
from tests.kits.wan.tiny import write_tiny_wan_ti2v_folder
from tests.models.step_inputs import step_inputs
from tests.models.wan.test_wan_clips import _batch

SEED = 11


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_wan_ti2v_folder(tmp_path_factory.mktemp("models") / "ti2v")


@pytest.fixture(scope="module")
def pipe(folder):
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _load(folder, **flow):
    model = ModelSection(pretrained_model_name_or_path=str(folder))
    return load_components(model, torch.float32, FlowSection(**flow))


def test_the_folder_loads_what_wan_pipeline_loads(folder, pipe):
    components = _load(folder)
    assert pipe.config.expand_timesteps and components.family.FRAME_RATE == 24.0
    for ours, theirs in ((components.denoiser, pipe.transformer), (components.vae, pipe.vae)):
        expected = theirs.state_dict()
        got = ours.state_dict()
        assert got.keys() == expected.keys()
        assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert components.family.latent_codec(components.vae).layout.factor == 16
    # a token's pixels: the pipeline's own spatial factor times the transformer's patch
    grid = pipe.vae_scale_factor_spatial * pipe.transformer.config.patch_size[1]
    assert components.family.PIXEL_MULTIPLE == grid == 32


def test_the_task_word_ti2v_5b_is_checked_against_the_released_width(folder):
    with pytest.raises(ModelError, match="task = 'ti2v-5B' is a 3072-wide Wan transformer"):
        _load(folder, task="ti2v-5B")


def test_a_ti2v_transformer_without_per_token_timesteps_is_refused_by_name(folder, tmp_path):
    import shutil

    copy = shutil.copytree(folder, tmp_path / "copy")
    index = json.loads((copy / "model_index.json").read_text())
    del index["expand_timesteps"]
    (copy / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(ModelError, match="TI2V-5B without its folder's expand_timesteps"):
        _load(copy)


def test_clip_loss_equals_the_pipelines_parts(folder, pipe):
    components = _load(folder)
    inputs = step_inputs(components, SEED)
    clips = _batch(5)  # 32 x 48: cut to 32 x 32, the 2x2 patches of 16 times smaller sides
    batch = {**clips, "pixel_values": clips["pixel_values"][..., :32]}
    with torch.no_grad():
        ours = micro_batch_loss(inputs, batch)
        expected = reference_loss(pipe, batch, SEED)
        reversed_ = micro_batch_loss(  # the frames reach the loss
            inputs, {**batch, "pixel_values": batch["pixel_values"].flip(2)}
        )
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)
    assert not torch.allclose(ours, reversed_)


def test_sample_equals_wan_pipelines(folder, pipe, tmp_path):
    import numpy as np
    from PIL import Image

    from library.sampling.generate import sample_images
    from library.sampling.prompts import SamplePrompt

    prompt = SamplePrompt(index=0, prompt="a red cube", negative_prompt="", seed=4, steps=2,
                          scale=5.0, sampler=None, width=152, height=128)  # fmt: skip
    done = sample_images(_load(folder), [prompt], step=0, output_dir=tmp_path, output_name="s")
    ours = np.asarray(Image.open(done.images[0]).convert("RGB"), dtype=np.int16)
    out = pipe(prompt="a red cube", negative_prompt="", width=128, height=128, num_frames=1,
               num_inference_steps=2, guidance_scale=5.0, output_type="pil",
               generator=torch.Generator().manual_seed(4))  # fmt: skip
    theirs = np.asarray(out.frames[0][0].convert("RGB"), dtype=np.int16)
    assert ours.shape == theirs.shape == (128, 128, 3)  # 152 rounded down to the 32 grid (16: 144)
    assert int(abs(ours - theirs).max()) <= 1


def test_our_lora_file_is_applied_exactly_by_diffusers(folder, tmp_path):
    """The default LoRA (musubi-tuner's lora_unet_ names over the ten block Linears) on the
    TI2V transformer, written as we write it: WanPipeline.load_lora_weights takes every key
    and its transformer then gives what ours gives on per-token timesteps."""
    from diffusers import WanPipeline

    from library.networks.lora import LoraSpec, apply_lora, randomize_lora
    from library.saving.lora_file import save_lora_file
    from tests.networks.lora_load_helpers import load_quietly

    components = _load(folder)
    family, transformer = components.family, components.denoiser
    apply_lora(transformer, family.adapter_targets(transformer, "unet", False), LoraSpec(4, 2.0))
    randomize_lora(transformer, torch.Generator().manual_seed(7), std=0.05)
    tensors = family.lora_tensors({"lora_unet": transformer})
    path = save_lora_file(tmp_path / "lora.safetensors", tensors, {}, torch.float32)
    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    plain = pipe.transformer.state_dict()
    assert not load_quietly(pipe, path, ("text_encoder",))
    gen = torch.Generator().manual_seed(3)
    noisy = torch.randn(1, 48, 2, 4, 4, generator=gen)
    states = torch.randn(1, 7, pipe.transformer.config.text_dim, generator=gen)
    with torch.no_grad():
        ours = family.predict(transformer, noisy, torch.tensor([300.0]),
                              family.assemble_conditioning(_text(states), {}, "cpu"))  # fmt: skip
        theirs = pipe.transformer(hidden_states=noisy, timestep=torch.full((1, 8), 300.0),
                                  encoder_hidden_states=_padded(states), return_dict=False)[0]  # fmt: skip
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    pipe.unload_lora_weights()
    assert pipe.transformer.state_dict().keys() == plain.keys()
    with torch.no_grad():
        unadapted = pipe.transformer(hidden_states=noisy, timestep=torch.full((1, 8), 300.0),
                                     encoder_hidden_states=_padded(states), return_dict=False)[0]  # fmt: skip
    assert not torch.allclose(ours, unadapted)  # the LoRA mattered


def _text(states):
    from library.models.conditioning import TextConditioning

    return TextConditioning(states, None, None, None)


def _padded(states):
    return torch.nn.functional.pad(states, (0, 0, 0, 512 - states.shape[1]))


def _run_config(tmp_path, model_dir, task=None):
    from library.config.loader import load_config

    path = tmp_path / "run.toml"
    flow = "" if task is None else f'[flow]\ntask = "{task}"\n'
    path.write_text(
        f"pretrained_model_name_or_path = {str(model_dir)!r}\nenable_bucket = true\n{flow}"
        '[[datasets]]\n[[datasets.subsets]]\nvideo_directory = "nowhere/clips"\n'
    )
    return load_config(str(path))


def test_before_any_weight_a_ti2v_run_cuts_24_fps_clips_on_a_32_pixel_grid(folder, tmp_path):
    """The checks made before loading (the clips' frame rate; the pixel grid the bucket and
    image-size checks use) take TI2V-5B's numbers from its folder or its task word, Wan 2.1's
    from a Wan 2.1 folder."""
    from library.models.families.family_choice import entry_for
    from library.training.reference_checks import check_clip_config
    from tests.kits.wan.tiny import write_tiny_wan_folder

    wan21 = write_tiny_wan_folder(tmp_path / "wan21")
    cases = ((folder, None, 24.0, 32), (wan21, None, 16.0, 16), (wan21, "ti2v-5B", 24.0, 32))
    for model_dir, task, rate, grid in cases:
        config = _run_config(tmp_path, model_dir, task)
        assert check_clip_config(config) == rate, model_dir
        family = entry_for(config.model, config.flow).family_of(config.model, config.flow)
        assert grid == family.PIXEL_MULTIPLE, model_dir
