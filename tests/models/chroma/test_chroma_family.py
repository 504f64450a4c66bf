"""Chroma's family on the tiny ChromaPipeline folder, against diffusers' pipeline: captions
encode as the pipeline encodes them, the transformer ignores a caption's padding beyond its
first padding token, and samples with padded captions are the pipeline's given boolean masks
(its own float masks add to the attention scores instead: docs/chroma.md). Options Chroma does
not take are refused by name."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
import torch
from PIL import Image

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ConfigError
from library.models.conditioning import encode_text
from library.models.families.chroma import family as family_module
from library.models.families.chroma.family import chroma_family
from library.models.loader import load_components
from library.sampling.generate import sample_images
from library.sampling.prompts import SamplePrompt

CAPTIONS = ["a cat", "a much longer caption about a shape on gray paper"]


@pytest.fixture(scope="module")
def chroma_dir(kit_folders):
    """The session's tiny kit folder (chroma chroma, seed 0): read only."""
    return kit_folders("chroma", "chroma")


@pytest.fixture(scope="module")
def pipe(chroma_dir):
    from diffusers import ChromaPipeline

    pipe = ChromaPipeline.from_pretrained(chroma_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def components(chroma_dir):
    model = ModelSection(pretrained_model_name_or_path=str(chroma_dir))
    return load_components(model, torch.float32, FlowSection(t5xxl_max_token_length=64))


@torch.no_grad()
def test_captions_encode_as_the_pipeline_encodes_them(components, pipe):
    c = components
    text = encode_text(c.family, c.tokenizers, c.text_encoders, CAPTIONS, "cpu")
    embeds, mask = pipe._get_t5_prompt_embeds(CAPTIONS, max_sequence_length=64)
    torch.testing.assert_close(text.hidden, embeds, rtol=0, atol=0)
    cond = c.family.assemble_conditioning(text, None, "cpu")
    from library.models.families.chroma.conditioning import transformer_text_mask

    # the pipeline's mask (caption tokens and the first padding token), as booleans
    assert torch.equal(transformer_text_mask(cond.unet_kwargs["text_mask"]), mask.bool())
    assert 0 < int(mask[0].sum()) < 64  # the short caption is padded


@torch.no_grad()
def test_padding_beyond_the_first_padding_token_changes_nothing(components):
    """The prediction for a caption padded to 64 tokens equals the transformer's on the caption
    cut after its first padding token, unmasked (no padding left to mask)."""
    c = components
    text = encode_text(c.family, c.tokenizers, c.text_encoders, CAPTIONS[:1], "cpu")
    cond = c.family.assemble_conditioning(text, None, "cpu")
    noisy = torch.randn(1, 16, 8, 6, generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.6])
    ours = c.family.predict(c.denoiser, noisy, sigma, cond)

    kept = int(text.mask[0].sum()) + 1
    tokens = noisy.view(1, 16, 4, 2, 3, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, 12, 64)
    rows, cols = torch.meshgrid(torch.arange(4.0), torch.arange(3.0), indexing="ij")
    image_ids = torch.stack([torch.zeros(12), rows.flatten(), cols.flatten()], dim=1)
    out = c.denoiser(hidden_states=tokens, encoder_hidden_states=text.hidden[:, :kept],
                     timestep=sigma, img_ids=image_ids, txt_ids=torch.zeros(kept, 3)).sample  # fmt: skip
    plain = out.view(1, 4, 3, 16, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(1, 16, 8, 6)
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-5)
    # and the padding would matter unmasked
    unmasked = c.denoiser(hidden_states=tokens, encoder_hidden_states=text.hidden,
                          timestep=sigma, img_ids=image_ids, txt_ids=torch.zeros(64, 3)).sample  # fmt: skip
    assert (unmasked - out).abs().max() > 1e-4


def _pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


@torch.no_grad()
@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_a_sample_with_padded_captions_is_the_pipelines_with_boolean_masks(
    components, pipe, tmp_path, scale
):
    prompt = SamplePrompt(index=0, prompt="a cat", negative_prompt="blurry", width=80, height=64,
                          seed=5, steps=3, scale=scale, sampler="euler")  # fmt: skip
    done = sample_images(components, [prompt], step=0, output_dir=tmp_path, output_name="s")
    with Image.open(done.images[0]) as img:
        ours = _pixels(img)
    embeds, ids, mask, neg, _, neg_mask = pipe.encode_prompt(
        "a cat", "blurry", do_classifier_free_guidance=True, max_sequence_length=64
    )

    def theirs(bool_masks: bool):
        cast = (lambda m: m.bool()) if bool_masks else (lambda m: m)
        guided = {"negative_prompt_embeds": neg, "negative_prompt_attention_mask": cast(neg_mask)}
        image = pipe(prompt_embeds=embeds, prompt_attention_mask=cast(mask), width=80, height=64,
                     num_inference_steps=3, guidance_scale=scale,
                     generator=torch.Generator().manual_seed(5),
                     **(guided if scale > 1 else {})).images[0]  # fmt: skip
        return _pixels(image)

    assert int(abs(ours - theirs(True)).max()) <= 1
    # the pipeline's own float masks give another image (they do not mask)
    assert int(abs(ours - theirs(False)).max()) > 1


def test_options_chroma_does_not_take_are_refused():
    family = chroma_family(FlowSection())
    model = ModelSection(pretrained_model_name_or_path="m")
    with pytest.raises(ConfigError, match="apply_t5_attn_mask = false"):
        family.check_options(model, FlowSection(apply_t5_attn_mask=False))
    family.check_options(model, FlowSection(apply_t5_attn_mask=True, t5xxl="t5.safetensors"))
    with pytest.raises(ConfigError, match="^clip_l applies to .*, not Chroma"):
        family.check_options(model, FlowSection(clip_l="clip_l.safetensors"))
    with pytest.raises(ConfigError, match="^guidance_scale applies to Flux.1 and FLUX.1 Kontext and FLUX.2 models, not Chroma"):
        family.check_options(model, FlowSection(guidance_scale=1.0))
    config = SimpleNamespace(
        network=SimpleNamespace(train_mode="lora", network_module="networks.lora_flux",
                                network_train_unet_only=False, conv_dim=None),
        saving=SimpleNamespace(lora_format="kohya"),
        flow=FlowSection(split_qkv=True),
        adapter=SimpleNamespace(preset=None),
    )  # fmt: skip
    family.check_training(config)  # T5 gets no adapter: the run trains the transformer alone
    assert chroma_family(FlowSection(t5xxl_max_token_length=77)).t5_max_length == 77


def test_gradient_checkpointing_keeps_the_mask_in_the_single_blocks(chroma_dir):
    """With gradient checkpointing on (diffusers' own, which hands a checkpointed single block
    no attention mask), a padded caption's prediction and the gradients of the transformer's
    weights equal those of the same transformer without checkpointing."""
    model = ModelSection(pretrained_model_name_or_path=str(chroma_dir))
    c = load_components(model, torch.float32, FlowSection(t5xxl_max_token_length=64))
    with torch.no_grad():
        text = encode_text(c.family, c.tokenizers, c.text_encoders, CAPTIONS, "cpu")
    cond = c.family.assemble_conditioning(text, None, "cpu")
    noisy = torch.randn(2, 16, 8, 6, generator=torch.Generator().manual_seed(2))
    sigma = torch.tensor([0.3, 0.8])
    c.denoiser.requires_grad_(True)
    c.denoiser.train()

    def run():
        c.denoiser.zero_grad(set_to_none=True)
        out = c.family.predict(c.denoiser, noisy, sigma, cond)
        out.square().mean().backward()
        grads = {n: p.grad.clone() for n, p in c.denoiser.named_parameters() if p.grad is not None}
        return out.detach(), grads

    plain, plain_grads = run()
    c.denoiser.enable_gradient_checkpointing()
    checkpointed, checkpointed_grads = run()
    torch.testing.assert_close(checkpointed, plain, rtol=0, atol=1e-6)
    assert plain_grads.keys() == checkpointed_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(checkpointed_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    # diffusers' checkpointing alone drops the mask: the same call without the wrapper differs
    with mock.patch.object(family_module, "single_blocks_masked", lambda *_: nullcontext()):
        unmasked, _ = run()
    assert (unmasked - plain).abs().max() > 1e-4


def test_kohyas_model_type_chroma_is_read_and_must_agree(chroma_dir):
    """kohya's Chroma configs carry model_type = "chroma" (its FLUX.1 trainer's switch)."""
    from library.errors import ConfigError

    model = ModelSection(pretrained_model_name_or_path=str(chroma_dir))
    loaded = load_components(model, torch.float32, FlowSection(model_type="chroma"))
    assert type(loaded.family).__name__ == "ChromaFamily"
    with pytest.raises(ConfigError, match=r"model_type = 'flux': .* is a Chroma model"):
        load_components(model, torch.float32, FlowSection(model_type="flux"))
