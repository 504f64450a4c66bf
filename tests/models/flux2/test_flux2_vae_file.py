"""The FLUX.2 VAE as Black Forest Labs and Comfy-Org ship it (flux2-vae.safetensors): the LDM
autoencoder names, the quant convs inside the encoder and decoder, the BatchNorm statistics."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.loader import load_components
from library.models.original_names import ldm_vae_to_original
from library.models.plans import CONFIG_METADATA
from tests.kits.flux2.tiny import vae_config
from tests.kits.flux2.tiny_files import write_tiny_flux2_files


def _original(vae) -> dict:
    """The VAE's tensors as diffusers' convert_flux2_to_diffusers.py reads them: quant_conv at
    encoder.quant_conv, post_quant_conv at decoder.post_quant_conv, bn's statistics as they
    are, the rest in the LDM names; no batch count."""
    state = {k: v.clone().contiguous() for k, v in vae.state_dict().items()}
    stats = {k: state.pop(k) for k in ("bn.running_mean", "bn.running_var")}
    state.pop("bn.num_batches_tracked")
    moved = {}
    for old, new in (("quant_conv.", "encoder.quant_conv."),
                     ("post_quant_conv.", "decoder.post_quant_conv.")):  # fmt: skip
        for key in [k for k in state if k.startswith(old)]:
            moved[new + key[len(old) :]] = state.pop(key)
    return {**ldm_vae_to_original(state), **moved, **stats}


def _load(files, vae):
    model = ModelSection(pretrained_model_name_or_path=str(files["transformer"]),
                         tokenizer_path=str(files["tokenizer"]), vae=str(vae))  # fmt: skip
    flow = FlowSection(text_encoder=str(files["text_encoder"]))
    return load_components(model, torch.float32, flow)


@pytest.mark.parametrize("header", [True, False])
def test_the_original_vae_file_loads_as_the_folders_vae(tmp_path, header):
    files = write_tiny_flux2_files(tmp_path / "f")
    folder_vae = _load(files, files["vae"]).vae
    original = _original(folder_vae)
    for key in ("encoder.down.0.block.0.conv1.weight", "decoder.up.0.block.0.conv1.weight",
                "encoder.mid.attn_1.q.weight", "encoder.quant_conv.weight",
                "decoder.post_quant_conv.weight", "bn.running_var"):  # fmt: skip
        assert key in original, key
    meta = {CONFIG_METADATA + "vae": json.dumps(vae_config())} if header else {}
    path = tmp_path / "flux2-vae.safetensors"
    save_file(original, str(path), metadata={"format": "pt", **meta})
    vae = _load(files, path).vae
    want = folder_vae.state_dict()
    got = vae.state_dict()
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert tuple(vae.config.block_out_channels) == vae_config()["block_out_channels"]
    assert vae.config.latent_channels == vae_config()["latent_channels"]
    if header:  # the same module: the same latents
        pixels = torch.rand(1, 3, 32, 32) * 2 - 1
        torch.testing.assert_close(vae.encode(pixels).latent_dist.mean,
                                   folder_vae.encode(pixels).latent_dist.mean)  # fmt: skip


def test_another_vae_file_is_refused_by_name(tmp_path):
    files = write_tiny_flux2_files(tmp_path / "f")
    vae = _load(files, files["vae"]).vae
    state = {k: v for k, v in _original(vae).items() if not k.startswith("bn.")}
    path = tmp_path / "ae.safetensors"
    save_file(state, str(path))
    with pytest.raises(
        ModelError, match=r"vae = .*ae.safetensors is no FLUX.2 VAE.*bn.running_mean"
    ):
        _load(files, path)
