"""Z-Image LoRA files: diffusers' own loader applies what we write, our files read back exactly,
and files in musubi-tuner's, ai-toolkit's, diffusers' and kohya's fused layouts (built here the
way those tools write them) read into the same factors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from library.errors import CheckpointError
from library.models.families.zimage.targets import default_targets, linear_paths
from tests.models.zimage.lora_helpers import (
    assert_same_factors,
    delta,
    random_factors,
    read_lora,
    tiny_transformer,
    write_lora,
)


@pytest.fixture(scope="module")
def transformer():
    return tiny_transformer()


def load(path):
    """(tensors, metadata) of a safetensors file."""
    with safe_open(str(path), framework="pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, handle.metadata()  # noqa: SIM118


def saved(tmp_path, tensors, metadata=None, name="lora.safetensors"):
    """Write ``tensors`` as a safetensors file and read it back: (tensors, metadata, path)."""
    path = tmp_path / name
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    return (*load(path), path)


def test_diffusers_loader_applies_our_file(zimage_dir, tmp_path):
    from diffusers import ZImagePipeline
    from peft.tuners.lora import LoraLayer

    pipe = ZImagePipeline.from_pretrained(zimage_dir, local_files_only=True)
    model = pipe.transformer
    # every Linear, not only the default targets: refiners, modulation, embedders and final
    # layer names must survive diffusers' key conversion too
    paths = linear_paths(model)
    base = {p: model.get_submodule(p).weight.detach().clone() for p in paths}
    factors = random_factors(model, paths)
    _, _, file = saved(tmp_path, write_lora(factors))

    pipe.load_lora_weights(str(file))
    adapted = sorted(n for n, m in model.named_modules() if isinstance(m, LoraLayer))
    assert adapted == sorted(paths)
    scale = 0.7
    pipe.fuse_lora(components=["transformer"], lora_scale=scale)
    for path in paths:
        layer = model.get_submodule(path)
        fused = getattr(layer, "base_layer", layer).weight.detach()
        expected = base[path] + scale * delta(factors[path])
        torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-6, msg=path)
        assert not torch.equal(fused, base[path]), path


def test_round_trip(transformer):
    factors = random_factors(transformer, default_targets(transformer))
    tensors = write_lora(factors)
    assert len(tensors) == 3 * len(factors)
    for key, tensor in tensors.items():
        assert key.startswith("diffusion_model.layers."), key
        if key.endswith(".alpha"):
            assert tensor.dim() == 0 and tensor.dtype == torch.float32
    assert tensors["diffusion_model.layers.1.attention.to_out.0.lora_up.weight"].shape[0] == 32
    assert_same_factors(read_lora(tensors, transformer), factors)
    half = {p: (d.bfloat16(), u.bfloat16(), a) for p, (d, u, a) in factors.items()}
    assert_same_factors(read_lora(write_lora(half), transformer), half)


def test_musubi_tuner_file(transformer, tmp_path):
    """musubi-tuner networks/lora.py LoRANetwork.save_weights: the state dict of its LoRA
    modules, named "lora_unet_" + the module path with "_" for ".", each with lora_down,
    lora_up and its "alpha" buffer, all cast to the save dtype; ss_* metadata and hashes."""
    rank, alpha = 4, 2.0
    paths = default_targets(transformer)
    generator = torch.Generator().manual_seed(5)
    tensors, expected = {}, {}
    for path in paths:
        layer = transformer.get_submodule(path)
        down = torch.randn(rank, layer.in_features, generator=generator).bfloat16()
        up = torch.randn(layer.out_features, rank, generator=generator).bfloat16()
        name = "lora_unet_" + path.replace(".", "_")
        tensors[f"{name}.lora_down.weight"] = down
        tensors[f"{name}.lora_up.weight"] = up
        tensors[f"{name}.alpha"] = torch.tensor(alpha).bfloat16()
        expected[path] = (down, up, alpha)
    assert "lora_unet_layers_0_attention_to_out_0.alpha" in tensors
    metadata = {
        "ss_network_module": "networks.lora_zimage",
        "ss_network_dim": str(rank),
        "ss_network_alpha": str(alpha),
        "ss_base_model_version": "z_image",
        "modelspec.architecture": "Z-Image",
        "modelspec.implementation": "https://github.com/Tongyi-MAI/Z-Image",
        "sshs_model_hash": "0" * 64,
        "sshs_legacy_hash": "0" * 8,
    }
    tensors, metadata, _ = saved(tmp_path, tensors, metadata)
    assert_same_factors(read_lora(tensors, transformer, metadata=metadata), expected)


def test_ai_toolkit_file(transformer, tmp_path):
    """ai-toolkit (toolkit/network_mixins.py get_state_dict with peft_format, z_image.py
    convert_lora_weights_before_save): "transformer." -> "diffusion_model.", lora_A/lora_B, no
    alpha (its LoRA runs at scale 1), float16 by default; joint blocks with modulation."""
    paths = default_targets(transformer, modulation=True)
    factors = random_factors(transformer, paths, seed=6, dtype=torch.float16)
    tensors = {}
    for path, (down, up, _) in factors.items():
        tensors[f"diffusion_model.{path}.lora_A.weight"] = down
        tensors[f"diffusion_model.{path}.lora_B.weight"] = up
    metadata = {
        "format": "pt",
        "name": "my_zimage_lora",
        "ss_base_model_version": "zimage",
        "ss_output_name": "my_zimage_lora",
        "training_info": json.dumps({"step": 500, "epoch": 3}),
        "software": json.dumps(
            {"name": "ai-toolkit", "repo": "https://github.com/ostris/ai-toolkit"}
        ),
        "sshs_model_hash": "0" * 64,
        "sshs_legacy_hash": "0" * 8,
    }
    tensors, metadata, _ = saved(tmp_path, tensors, metadata)
    expected = {p: (d, u, float(d.shape[0])) for p, (d, u, _) in factors.items()}
    assert_same_factors(read_lora(tensors, transformer, metadata=metadata), expected)


def test_diffusers_peft_file(transformer, tmp_path):
    """A file diffusers' own ZImagePipeline.save_lora_weights writes from a peft adapter, with
    its lora_adapter_metadata (alpha and an alpha pattern), and the same file without it."""
    from diffusers import ZImagePipeline
    from peft import LoraConfig, get_peft_model_state_dict

    model = tiny_transformer(seed=2)
    paths = sorted(default_targets(model))
    config = LoraConfig(
        r=4, lora_alpha=8.0, target_modules=paths, alpha_pattern={"layers.1.attention.to_q": 2.0}
    )
    model.add_adapter(config)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator))
    ZImagePipeline.save_lora_weights(
        tmp_path,
        transformer_lora_layers=get_peft_model_state_dict(model),
        transformer_lora_adapter_metadata=model.peft_config["default"].to_dict(),
    )
    tensors, metadata = load(tmp_path / "pytorch_lora_weights.safetensors")
    assert "transformer.layers.0.attention.to_k.lora_A.weight" in tensors
    expected = {}
    for path in paths:
        layer = model.get_submodule(path)
        alpha = 2.0 if path == "layers.1.attention.to_q" else 8.0
        expected[path] = (layer.lora_A["default"].weight, layer.lora_B["default"].weight, alpha)
        assert layer.scaling["default"] == alpha / 4  # what the metadata must reproduce
    expected = {p: (d.detach(), u.detach(), a) for p, (d, u, a) in expected.items()}
    assert_same_factors(read_lora(tensors, model, metadata=metadata), expected)
    no_metadata = {p: (d, u, 4.0) for p, (d, u, _) in expected.items()}
    assert_same_factors(read_lora(tensors, model), no_metadata)


def test_kohya_fused_qkv_file(transformer):
    """musubi-tuner's networks/convert_z_image_lora_to_comfy.py: its own files renamed to the
    original modules (attention_to_out_0 -> attention_out) and q, k, v merged into one
    attention_qkv module: downs stacked, ups block-diagonal, alpha times 3."""
    # one rank and alpha for all, as musubi-tuner trains them
    factors = random_factors(transformer, default_targets(transformer), seed=8, rank=2, alpha=1.5)
    tensors = {}
    for block in ("layers.0", "layers.1"):
        q, k, v = (factors[f"{block}.attention.to_{x}"] for x in "qkv")
        name = "lora_unet_" + block.replace(".", "_") + "_attention_qkv"
        tensors[f"{name}.lora_down.weight"] = torch.cat([q[0], k[0], v[0]])
        tensors[f"{name}.lora_up.weight"] = torch.block_diag(q[1], k[1], v[1])
        tensors[f"{name}.alpha"] = torch.tensor(1.5 * 3)
        for path in (f"{block}.attention.to_out.0", *(f"{block}.feed_forward.w{i}" for i in "123")):
            original = path.replace("attention.to_out.0", "attention.out")
            down, up, alpha = factors[path]
            name = "lora_unet_" + original.replace(".", "_")
            tensors[f"{name}.lora_down.weight"] = down
            tensors[f"{name}.lora_up.weight"] = up
            tensors[f"{name}.alpha"] = torch.tensor(alpha)
    assert "lora_unet_layers_1_attention_out.alpha" in tensors
    assert_same_factors(read_lora(tensors, transformer), factors)


def test_dense_fused_qkv_gives_each_part_its_rows(transformer):
    generator = torch.Generator().manual_seed(9)
    down = torch.randn(3, 32, generator=generator)
    up = torch.randn(96, 3, generator=generator)  # not block-diagonal
    tensors = {
        "diffusion_model.layers.0.attention.qkv.lora_down.weight": down,
        "diffusion_model.layers.0.attention.qkv.lora_up.weight": up,
        "diffusion_model.layers.0.attention.qkv.alpha": torch.tensor(2.0),
    }
    weights = read_lora(tensors, transformer)
    fused = delta((down, up, 2.0))
    for index, part in enumerate("qkv"):
        got = weights[f"layers.0.attention.to_{part}"]
        assert got[2] == 2.0
        torch.testing.assert_close(delta(got), fused[32 * index : 32 * (index + 1)])


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            {"diffusion_model.layers.7.attention.to_q.lora_down.weight": torch.zeros(1, 32)},
            "'diffusion_model.layers.7.attention.to_q.lora_down.weight' names "
            "'diffusion_model.layers.7.attention.to_q', which is no Linear",
        ),
        (
            {"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": torch.zeros(1, 32)},
            "'lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight' names",
        ),
        (
            {"diffusion_model.layers.0.attention.to_q.hada_w1_a": torch.zeros(32, 1)},
            "'diffusion_model.layers.0.attention.to_q.hada_w1_a' is not an adapter tensor",
        ),
        (
            {"diffusion_model.layers.0.attention.to_q.lora_down.weight": torch.zeros(1, 32)},
            "diffusion_model.layers.0.attention.to_q has no up weight",
        ),
        (
            {
                "diffusion_model.layers.0.attention.to_q.lora_down.weight": torch.zeros(1, 40),
                "diffusion_model.layers.0.attention.to_q.lora_up.weight": torch.zeros(32, 1),
            },
            r"has down \[1, 40\] / up \[32, 1\], the layer needs \[r, 32\] / \[32, r\]",
        ),
        (
            {
                "diffusion_model.layers.0.attention.to_q.lora_down.weight": torch.zeros(1, 32),
                "diffusion_model.layers.0.attention.to_q.lora_up.weight": torch.zeros(32, 1),
                "lora_unet_layers_0_attention_to_q.lora_down.weight": torch.zeros(1, 32),
                "lora_unet_layers_0_attention_to_q.lora_up.weight": torch.zeros(32, 1),
            },
            "both adapt layers.0.attention.to_q",
        ),
        (
            {"diffusion_model.layers.0.attention.to_q.dora_scale": torch.zeros(32, 1)},
            "DoRA",
        ),
    ],
)
def test_refused_files_name_the_key(transformer, tensors, message):
    with pytest.raises(CheckpointError, match=message):
        read_lora(tensors, transformer, source="x.safetensors")


def test_writer_refuses_a_non_pair():
    with pytest.raises(ValueError, match="layers.0.attention.to_q: down"):
        write_lora({"layers.0.attention.to_q": (torch.zeros(2, 32), torch.zeros(32, 3), 1.0)})


def test_trainer_adapters_round_trip():
    """The shared peft adapters (library.networks.lora) on the default targets: their weights
    written, read into a second model's adapters, give the same adapters."""
    from library.networks.fused_keys import adapter_weights, load_adapter_weights
    from library.networks.lora import LoraSpec, apply_lora, randomize_lora

    trained, fresh = tiny_transformer(seed=3), tiny_transformer(seed=3)
    for model in (trained, fresh):
        apply_lora(model, default_targets(model), LoraSpec(dim=4, alpha=2.0))
    randomize_lora(trained, torch.Generator().manual_seed(10))
    weights = adapter_weights(trained)
    load_adapter_weights(fresh, read_lora(write_lora(weights), fresh), "lora.safetensors")
    assert_same_factors(adapter_weights(fresh), weights)
