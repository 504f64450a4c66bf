"""Our Z-Image LoRA and LyCORIS files against ComfyUI's key map for its Z-Image model, reproduced
here as data, and ComfyUI's way of applying them (row slices of the fused qkv) against the
diffusers model's own weights.

ComfyUI runs Z-Image as its Lumina2 (NextDiT) model; its state dict holds the original names
("diffusion_model." + library/models/families/zimage/keys.py's original keys). The facts, from
Comfy-Org/ComfyUI:
- comfy/lora.py model_lora_keys_unet: for every model key "diffusion_model.<name>.weight", the
  LoRA names "lora_unet_<name with _ for .>" and "diffusion_model.<name>"; then, in the
  ``isinstance(model, comfy.model_base.Lumina2)`` branch, for every key of
  comfy.utils.z_image_to_diffusers ending in ".weight", the names "diffusion_model.<key>",
  "transformer.<key>", "lycoris_<key with _ for .>" and "<key>" without ".weight";
- comfy/utils.py z_image_to_diffusers: diffusers names -> original keys, to_q/to_k/to_v as
  (qkv key, (0, offset, dim)) row slices (COMFY_BLOCK, COMFY_BASIC below);
- comfy/lora.py load_lora and comfy/weight_adapter (lora.py, loha.py, lokr.py): the suffixes
  read per module name x ("x.lora_up.weight" + "x.lora_down.weight", "x.lora_B.weight" +
  "x.lora_A.weight", ..., "x.alpha", LoHa "x.hada_*", LoKr "x.lokr_*"); a LoRA adds
  strength * alpha / rank * up @ down (rank = rows of down, no alpha: scale 1) to the target,
  narrowed to the slice when the target has one (comfy/model_patcher add_patches and
  comfy/lora.py calculate_weight).
"""

from __future__ import annotations

import pytest
import torch

from library.errors import CheckpointError
from library.models.families.zimage import keys
from library.models.families.zimage.lora_keys import file_modules
from library.models.families.zimage.targets import default_targets, linear_paths
from library.networks.lycoris.file_math import merged_weight
from tests.models.zimage.lora_helpers import (
    delta,
    random_factors,
    read_lycoris,
    tiny_transformer,
    write_lora,
    write_lycoris,
)

# comfy/utils.py z_image_to_diffusers: per block, diffusers name -> original name
COMFY_BLOCK = {
    "attention.norm_q.weight": "attention.q_norm.weight",
    "attention.norm_k.weight": "attention.k_norm.weight",
    "attention.to_out.0.weight": "attention.out.weight",
    "attention.to_out.0.bias": "attention.out.bias",
    "attention_norm1.weight": "attention_norm1.weight",
    "attention_norm2.weight": "attention_norm2.weight",
    "feed_forward.w1.weight": "feed_forward.w1.weight",
    "feed_forward.w2.weight": "feed_forward.w2.weight",
    "feed_forward.w3.weight": "feed_forward.w3.weight",
    "ffn_norm1.weight": "ffn_norm1.weight",
    "ffn_norm2.weight": "ffn_norm2.weight",
    "adaLN_modulation.0.weight": "adaLN_modulation.0.weight",  # has_adaln=True for every block
    "adaLN_modulation.0.bias": "adaLN_modulation.0.bias",
}
# comfy/utils.py z_image_to_diffusers MAP_BASIC: (original, diffusers)
COMFY_BASIC = [
    ("final_layer.linear.weight", "all_final_layer.2-1.linear.weight"),
    ("final_layer.linear.bias", "all_final_layer.2-1.linear.bias"),
    ("final_layer.adaLN_modulation.1.weight", "all_final_layer.2-1.adaLN_modulation.1.weight"),
    ("final_layer.adaLN_modulation.1.bias", "all_final_layer.2-1.adaLN_modulation.1.bias"),
    ("x_embedder.weight", "all_x_embedder.2-1.weight"),
    ("x_embedder.bias", "all_x_embedder.2-1.bias"),
    ("x_pad_token", "x_pad_token"),
    ("cap_embedder.0.weight", "cap_embedder.0.weight"),
    ("cap_embedder.1.weight", "cap_embedder.1.weight"),
    ("cap_embedder.1.bias", "cap_embedder.1.bias"),
    ("cap_pad_token", "cap_pad_token"),
    ("t_embedder.mlp.0.weight", "t_embedder.mlp.0.weight"),
    ("t_embedder.mlp.0.bias", "t_embedder.mlp.0.bias"),
    ("t_embedder.mlp.2.weight", "t_embedder.mlp.2.weight"),
    ("t_embedder.mlp.2.bias", "t_embedder.mlp.2.bias"),
]
# comfy/weight_adapter/loha.py and lokr.py (and comfy/lora.py load_lora): LyCORIS suffixes read
COMFY_LOHA = {"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2"}
COMFY_LOKR = {"lokr_w1", "lokr_w2", "lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b", "lokr_t2"}
COMFY_SHARED = {"alpha", "dora_scale"}
PREFIX = "diffusion_model."


def comfy_z_image_to_diffusers(n_layers: int, dim: int, n_refiner: int = 2) -> dict:
    """diffusers key -> (ComfyUI model key, row slice (dim, start, size) or None)."""
    table = {}
    for group, count in (("layers", n_layers), ("context_refiner", n_refiner),
                         ("noise_refiner", n_refiner)):  # fmt: skip
        for index in range(count):
            block = f"{group}.{index}"
            for end in ("weight", "bias"):
                for row, part in enumerate("qkv"):
                    qkv = f"{PREFIX}{block}.attention.qkv.{end}"
                    table[f"{block}.attention.to_{part}.{end}"] = (qkv, (0, row * dim, dim))
            for diffusers, original in COMFY_BLOCK.items():
                table[f"{block}.{diffusers}"] = (f"{PREFIX}{block}.{original}", None)
    for original, diffusers in COMFY_BASIC:
        table[diffusers] = (PREFIX + original, None)
    return table


def comfy_key_map(model_keys, n_layers: int, dim: int) -> dict:
    """LoRA module name -> (model key, slice) as model_lora_keys_unet builds it for Lumina2."""
    key_map = {}
    for key in model_keys:
        if key.endswith(".weight"):
            name = key[len(PREFIX) : -len(".weight")]
            key_map["lora_unet_" + name.replace(".", "_")] = (key, None)
            key_map[key[: -len(".weight")]] = (key, None)
    for key, target in comfy_z_image_to_diffusers(n_layers, dim).items():
        if key.endswith(".weight"):
            name = key[: -len(".weight")]
            for lora_name in (PREFIX + name, "transformer." + name,
                              "lycoris_" + name.replace(".", "_"), name):  # fmt: skip
                key_map[lora_name] = target
    return key_map


@pytest.fixture(scope="module")
def model():
    return tiny_transformer(seed=4)


@pytest.fixture(scope="module")
def comfy(model):
    """(ComfyUI's model state dict for the tiny model, its LoRA key map)."""
    state = keys.diffusers_to_original(model.state_dict(), PREFIX)
    n_layers = len({k.split(".")[2] for k in state if k.startswith(PREFIX + "layers.")})
    return state, comfy_key_map(state, n_layers, model.config.dim)


def module_names(tensors, suffixes) -> dict:
    """module name -> {suffix: tensor}, for keys ending in one of ``suffixes``; every key must."""
    modules = {}
    for key, tensor in tensors.items():
        suffix = next(s for s in sorted(suffixes, key=len, reverse=True) if key.endswith("." + s))
        modules.setdefault(key[: -len(suffix) - 1], {})[suffix] = tensor
    return modules


def comfy_apply(state, key_map, modules, change) -> dict:
    """ComfyUI's merge: each module's change added to its target key, narrowed to its slice;
    the merged model in diffusers' names."""
    merged = {k: v.clone().float() for k, v in state.items()}
    for name, parts in modules.items():
        key, offset = key_map[name]
        weight = merged[key] if offset is None else merged[key].narrow(*offset)
        weight.copy_(change(weight, parts))
    return keys.original_to_diffusers({k.removeprefix(PREFIX): v for k, v in merged.items()})


def test_every_lora_module_we_write_is_in_comfys_map(model, comfy):
    _, key_map = comfy
    # all Linears: whatever targets a run picks, ComfyUI must know their names
    tensors = write_lora(random_factors(model, linear_paths(model)))
    modules = module_names(tensors, ("lora_down.weight", "lora_up.weight", "alpha"))
    assert len(modules) == len(linear_paths(model))
    for name, parts in modules.items():
        assert name in key_map, name
        assert set(parts) == {"lora_down.weight", "lora_up.weight", "alpha"}, name
    # q, k and v are the qkv weight's row blocks in that order
    assert key_map[PREFIX + "layers.1.attention.to_k"] == (
        PREFIX + "layers.1.attention.qkv.weight",
        (0, 32, 32),
    )


def test_comfy_merges_our_lora_into_the_same_weights_as_diffusers(model, comfy):
    state, key_map = comfy
    paths = default_targets(model, refiners=True, modulation=True)
    factors = random_factors(model, paths, seed=11)
    modules = module_names(write_lora(factors), ("lora_down.weight", "lora_up.weight", "alpha"))

    def lora_change(weight, parts):
        down, up = parts["lora_down.weight"], parts["lora_up.weight"]
        return weight + parts["alpha"].item() / down.shape[0] * (up @ down)

    merged = comfy_apply(state, key_map, modules, lora_change)
    for name, weight in model.state_dict().items():
        path = name.removesuffix(".weight")
        expected = weight + delta(factors[path]) if path in factors else weight
        torch.testing.assert_close(merged[name], expected, rtol=1e-6, atol=1e-6, msg=name)


def test_other_tools_names_against_comfys_map(comfy):
    _, key_map = comfy
    # musubi-tuner's own names (diffusers paths after lora_unet_) are not ComfyUI's: it ships
    # converters; kohya's original names and ai-toolkit's diffusion_model. names are
    assert "lora_unet_layers_0_attention_to_q" not in key_map
    assert "lora_unet_layers_0_attention_to_out_0" not in key_map
    assert "lora_unet_layers_0_attention_qkv" in key_map
    assert "lora_unet_layers_0_attention_out" in key_map
    assert "diffusion_model.layers.0.adaLN_modulation.0" in key_map
    assert key_map["transformer.noise_refiner.1.attention.to_v"][1] == (0, 64, 32)


def test_every_file_name_we_read_that_comfy_maps_lands_on_the_same_weights(model, comfy):
    """Where ComfyUI knows a name we read, it targets the rows of the Linears we read it into."""
    _, key_map = comfy
    dim = model.config.dim
    for name, parts in file_modules(model).items():
        if name not in key_map:
            assert name.startswith("lora_unet_"), name  # musubi-tuner's own names only
            continue
        key, offset = key_map[name]
        original = keys.original_name(parts[0] + ".weight")
        assert key == PREFIX + original, name
        if len(parts) == 1 and offset is not None:
            row = "qkv".index(parts[0][-1])
            assert offset == (0, row * dim, dim), name


@pytest.mark.parametrize("algo", ["loha", "lokr"])
def test_lycoris_names_and_comfys_merge(model, comfy, algo):
    from library.networks.lycoris.layer import LycorisLayer
    from library.networks.lycoris.spec import LycorisSpec

    state, key_map = comfy
    spec = LycorisSpec(algo=algo, dim=2, alpha=1.5)
    generator = torch.Generator().manual_seed(12)
    layers = {}
    for path in default_targets(model):
        layer = LycorisLayer(model.get_submodule(path), spec, "linear", generator=0)
        with torch.no_grad():
            for param in layer.adapter_parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
        layers[path] = layer
    tensors = write_lycoris({path: layer.file_tensors() for path, layer in layers.items()})
    allowed = (COMFY_LOHA if algo == "loha" else COMFY_LOKR) | COMFY_SHARED
    modules = module_names(tensors, tuple(allowed))
    assert len(modules) == len(layers)
    assert all(name in key_map for name in modules)

    def lycoris_change(weight, parts):
        return merged_weight(weight, parts)

    merged = comfy_apply(state, key_map, modules, lycoris_change)
    for path, layer in layers.items():
        torch.testing.assert_close(merged[path + ".weight"], layer.merged_weight(), msg=path)

    read = read_lycoris(tensors, model)
    assert sorted(read) == sorted(layers)
    for path, layer in layers.items():
        expected = layer.file_tensors()
        assert sorted(read[path]) == sorted(expected)
        assert all(torch.equal(read[path][s], expected[s]) for s in expected), path


def test_lycoris_other_names_and_refusals(model):
    w1, w2 = torch.ones(4, 4), torch.ones(8, 8)
    musubi = {"lora_unet_layers_0_attention_to_q.lokr_w1": w1,
              "lora_unet_layers_0_attention_to_q.lokr_w2": w2,
              "lora_unet_layers_0_attention_to_q.alpha": torch.tensor(1.0)}  # fmt: skip
    assert sorted(read_lycoris(musubi, model)["layers.0.attention.to_q"]) == [
        "alpha",
        "lokr_w1",
        "lokr_w2",
    ]
    fused = {"lora_unet_layers_0_attention_qkv.hada_w1_a": torch.zeros(96, 2)}
    with pytest.raises(CheckpointError, match="'lora_unet_layers_0_attention_qkv.hada_w1_a'"):
        read_lycoris(fused, model)
    with pytest.raises(CheckpointError, match="'diffusion_model.layers.0.attention.to_q.glora'"):
        read_lycoris({"diffusion_model.layers.0.attention.to_q.glora": w1}, model)
    with pytest.raises(CheckpointError, match="'lycoris_layers_5_attention_to_q.lokr_w1' names"):
        read_lycoris({"lycoris_layers_5_attention_to_q.lokr_w1": w1}, model)
    with pytest.raises(ValueError, match="'hada_w9'"):
        write_lycoris({"layers.0.attention.to_q": {"hada_w9": w1}})


def test_lora_tool_check_uses_comfys_map(zimage_dir):
    """``lora_tool.py check --loader comfyui`` (library/lora_tools/comfyui_keys.py with the
    family's names) accepts, for each Linear of the transformer, exactly the names ComfyUI's map
    above gives that whole Linear or its rows of the fused qkv, for the same weight and rows
    (ComfyUI's names of the fused qkv itself stand for three Linears, which the toolbox's
    per-Linear table does not hold)."""
    from library.lora_tools.base_model import DENOISER, layer_table
    from library.lora_tools.comfyui_keys import comfy_key_map as tool_key_map
    from tests.lora_tools.model_helpers import load

    components = load(zimage_dir)
    model = components.denoiser
    state = keys.diffusers_to_original(model.state_dict(), PREFIX)
    n_layers = len({k.split(".")[2] for k in state if k.startswith(PREFIX + "layers.")})
    theirs = comfy_key_map(state, n_layers, model.config.dim)
    targets = comfy_z_image_to_diffusers(n_layers, model.config.dim)
    linear_targets = {targets[f"{path}.weight"] for path in linear_paths(model)}
    ours = {}
    for name, (layer, parts) in tool_key_map(components, layer_table(components)).items():
        if layer.component == DENOISER:
            assert parts is None, name
            (path,) = layer.parts
            ours[name] = targets[f"{path}.weight"]
    assert ours == {name: t for name, t in theirs.items() if t in linear_targets}
