"""Qwen-Image's folder, conditioning, transformer call and latents against diffusers'
QwenImagePipeline on the tiny folder: what our loader reads, what encode_text gives, what
predict computes and how latents are normalised must be the pipeline's, bit for bit."""

from __future__ import annotations

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ConfigError
from library.models.families.qwenimage.spec import SPEC, claims_qwenimage
from library.models.families.qwenimage.targets import default_targets
from library.models.families.registry import claim_order, entry_of
from tests.kits.zimage.tiny import write_tiny_zimage_folder

CAPTIONS = ["a red cube", "a much longer caption about a blue sphere resting on a wooden table"]


def _model(path) -> ModelSection:
    return ModelSection(pretrained_model_name_or_path=str(path))


def test_the_folder_loads_as_the_pipeline_reads_it(qwenimage_components, qwenimage_pipe):
    c = qwenimage_components
    for ours, theirs in (
        (c.denoiser, qwenimage_pipe.transformer),
        (c.vae, qwenimage_pipe.vae),
        (c.text_encoders[0], qwenimage_pipe.text_encoder),
    ):
        assert type(ours) is type(theirs)
        mine, ref = ours.state_dict(), theirs.state_dict()
        assert mine.keys() == ref.keys()
        assert all(torch.equal(mine[k], ref[k]) for k in ref)
        assert not any(p.requires_grad for p in ours.parameters())
    text = "<|im_start|>user\na cat<|im_end|>"
    assert c.tokenizers[0](text).input_ids == qwenimage_pipe.tokenizer(text).input_ids
    assert entry_of(c.family).name == "qwenimage"
    assert c.family.bucket_grid(c.denoiser) == 16


def test_claims_qwenimage_folders_and_transformer_files(qwenimage_dir, tmp_path):
    flow = FlowSection()
    assert claims_qwenimage(_model(qwenimage_dir), flow)
    zimage = write_tiny_zimage_folder(tmp_path / "zimage")
    assert not claims_qwenimage(_model(zimage), flow)
    first = next(e for e in claim_order() if e.claims and e.claims(_model(qwenimage_dir), flow))
    assert first.name == "qwenimage"
    keys = ["transformer_blocks.0.img_mod.1.weight", "img_in.weight"]
    assert SPEC.main.detect(keys) == ("diffusers", "")
    prefixed = ["model.diffusion_model." + k for k in keys]
    assert SPEC.main.detect(prefixed) == ("diffusers", "model.diffusion_model.")
    assert SPEC.main.detect(["transformer_blocks.0.attn.to_q.weight"]) is None  # SD3, FLUX.1


@pytest.mark.parametrize("captions", [CAPTIONS, CAPTIONS[:1] * 2], ids=["lengths", "equal"])
def test_encode_text_is_the_pipelines_prompt_embeds(qwenimage_components, qwenimage_pipe,
                                                     captions):  # fmt: skip
    c = qwenimage_components
    with torch.no_grad():
        text = c.family.encode_text(c.tokenizers, c.text_encoders, captions, "cpu")
        embeds, mask = qwenimage_pipe.encode_prompt(captions, device="cpu")
    assert torch.equal(text.hidden, embeds)
    if mask is None:  # the pipeline drops an all-ones mask
        assert bool((text.lengths == embeds.shape[1]).all())
    else:
        assert text.lengths.tolist() == mask.sum(dim=1).tolist()
        assert len(set(text.lengths.tolist())) == 2


def test_predict_is_the_transformer_as_the_pipeline_calls_it(qwenimage_components,
                                                              qwenimage_pipe):  # fmt: skip
    """Packing, img_shapes, the caption mask and the timestep as QwenImagePipeline passes them
    (its own _pack_latents / _unpack_latents), on latents of 8 x 12 and sigma in [0, 1]."""
    from diffusers import QwenImagePipeline

    c, pipe = qwenimage_components, qwenimage_pipe
    gen = torch.Generator().manual_seed(3)
    noisy = torch.randn(2, 16, 1, 8, 12, generator=gen)
    sigmas = torch.tensor([0.25, 0.8])
    with torch.no_grad():
        text = c.family.encode_text(c.tokenizers, c.text_encoders, CAPTIONS, "cpu")
        cond = c.family.assemble_conditioning(text, None, "cpu")
        ours = c.family.predict(c.denoiser, noisy, sigmas, cond)
        embeds, mask = pipe.encode_prompt(CAPTIONS, device="cpu")
        packed = QwenImagePipeline._pack_latents(noisy.transpose(1, 2), 2, 16, 8, 12)
        out = pipe.transformer(
            hidden_states=packed,
            timestep=sigmas * 1000 / 1000,
            encoder_hidden_states=embeds,
            encoder_hidden_states_mask=mask,
            img_shapes=[[(1, 4, 6)]] * 2,
            return_dict=False,
        )[0]
        theirs = QwenImagePipeline._unpack_latents(out, 8 * 8, 12 * 8, 8)
    assert ours.shape == (2, 16, 1, 8, 12)
    assert torch.equal(ours, theirs)


def test_latents_are_normalised_as_the_pipeline_denormalises_them(qwenimage_components):
    """QwenImagePipeline decodes latents / (1 / std) + mean per channel; the codec's to_decoder
    must be that, and to_latents its inverse."""
    c = qwenimage_components
    codec = c.family.latent_codec(c.vae)
    latents = torch.randn(2, 16, 1, 4, 6)
    config = c.vae.config
    mean = torch.tensor(config.latents_mean).view(1, 16, 1, 1, 1)
    std = 1.0 / torch.tensor(config.latents_std).view(1, 16, 1, 1, 1)
    torch.testing.assert_close(codec.to_decoder(latents), latents / std + mean)
    torch.testing.assert_close(codec.to_latents(codec.to_decoder(latents)), latents)
    assert codec.layout.channels == 16


def test_default_lora_targets_are_the_blocks_linears_but_modulation(qwenimage_components):
    transformer = qwenimage_components.denoiser
    # the left-out Linears really get no gradient: the output is the image stream's
    hidden = torch.randn(1, 16, 64, requires_grad=False)
    states = torch.randn(1, 5, transformer.config.joint_attention_dim)
    with torch.enable_grad():
        for p in transformer.parameters():
            p.requires_grad_(True)
        out = transformer(hidden_states=hidden, encoder_hidden_states=states,
                          timestep=torch.tensor([0.5]), img_shapes=[[(1, 4, 4)]],
                          return_dict=False)[0]  # fmt: skip
        out.square().sum().backward()
    for name, p in transformer.named_parameters():
        dead = name.startswith(
            ("transformer_blocks.1.txt_mlp", "transformer_blocks.1.attn.to_add_out")
        )
        assert (p.grad is None) == dead, name
        p.requires_grad_(False)
        p.grad = None
    targets = default_targets(transformer)
    assert len(targets) == 2 * 12 - 3  # 2 tiny blocks, the last one's caption tail left out
    assert "transformer_blocks.1.attn.add_q_proj" in targets
    assert "transformer_blocks.0.txt_mlp.net.2" in targets
    assert "transformer_blocks.0.attn.to_add_out" in targets
    assert not any(p.startswith("transformer_blocks.1.txt_mlp") for p in targets)
    assert "transformer_blocks.1.attn.to_add_out" not in targets
    assert not any("_mod." in path for path in targets)
    assert len(default_targets(transformer, modulation=True)) == 2 * 14 - 3
    with pytest.raises(ConfigError, match="transformer only"):
        qwenimage_components.family.adapter_targets(transformer, "text_encoder", False)
