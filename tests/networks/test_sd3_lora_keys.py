"""SD3 / SD3.5 LoRA files: kohya's layout (original MMDiT names, fused qkv, the pre-only block's
swapped modulation halves) and diffusers' layout (peft keys, scale folded into lora_B).

Every expectation comes from outside library/models/families/sd3/lora_keys.py: the original-layout
state dict is diffusers' own converter inverted (tests/networks/sd3_helpers.py, checked against the
converter), kohya's naming rule is applied to its keys, merges are peft's, and diffusers'
StableDiffusion3Pipeline loads the diffusers-layout file.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
from safetensors.torch import load_file

from library.errors import CheckpointError
from library.models.families.sd3.lora_keys import (
    CLIP_G,
    CLIP_L,
    T5,
    TRANSFORMER,
    adapter_weights,
    diffusers_lora_tensors,
    export_lora,
    import_diffusers_lora,
    import_lora,
    is_diffusers_layout,
    load_adapter_weights,
    target_paths,
    text_encoder_modules,
    transformer_modules,
)
from library.networks import kohya_keys
from library.networks.lora import randomize_lora, set_lora_scale
from library.saving.lora_file import save_lora_file
from tests.networks.flux_helpers import adapt
from tests.networks.sd3_helpers import (
    VARIANTS,
    build_clip,
    build_sd3,
    from_original,
    meta_sd3,
    peft_merged,
    sd3_config,
    to_original,
)

# kohya's SingleDiTBlock (library/sd3_models.py) declares norm1, attn (qkv, proj), attn2 (qkv,
# proj; dual-attention x blocks only), norm2, mlp (fc1, fc2), adaLN_modulation (SiLU, Linear);
# MMDiTBlock declares context_block before x_block. named_modules visits them in this order.
DECLARED = ["attn.qkv", "attn.proj", "attn2.qkv", "attn2.proj", "mlp.fc1", "mlp.fc2"]
DECLARED.append("adaLN_modulation.1")
BLOCK_LINEAR = re.compile(r"joint_blocks\.(\d+)\.(context_block|x_block)\.(.+)\.weight")


def kohya_expected(original):
    """kohya's lora_sd3 rule on an original-layout state dict: every Linear (2-D weight) inside a
    SingleDiTBlock, ``lora_unet_`` + its path with underscores, in named_modules order, with
    the original weight's (in, out)."""
    found = []
    for key, weight in original.items():
        match = BLOCK_LINEAR.fullmatch(key)
        if match and weight.dim() == 2:
            block, stream, layer = match.groups()
            order = (int(block), stream == "x_block", DECLARED.index(layer))
            found.append((order, "lora_unet_" + key[: -len(".weight")].replace(".", "_"), weight))
    return [(name, weight.shape[1], weight.shape[0]) for _, name, weight in sorted(found)]


def comfy_table(original):
    """kohya name -> original weight key, as ComfyUI maps them (comfy/lora.py
    model_lora_keys_unet: ``lora_unet_`` + the key without ``.weight``, dots as underscores)."""
    return {
        "lora_unet_" + key[: -len(".weight")].replace(".", "_"): key
        for key in original
        if key.endswith(".weight")
    }


def adapted(plain, modules, seed, rank=4):
    """A copy of ``plain`` with random adapters on every target; each kohya module has its own
    alpha (1, 2 or 3; its fused parts share it)."""
    model = copy.deepcopy(plain)
    adapt(model, target_paths(modules), rank=rank, alpha=float(rank))
    randomize_lora(model, torch.Generator().manual_seed(seed), std=0.1)
    alphas = {p: 1.0 + i % 3 for i, m in enumerate(modules) for p in m.parts}
    set_lora_scale(model, alphas)
    return model


@pytest.fixture(autouse=True)
def one_thread():
    """Many small tensor ops: one thread avoids threads waiting on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# The inverse converter the other tests stand on ----------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_original_layout_is_diffusers_converter_inverted(variant):
    state = build_sd3(variant).state_dict()
    original = to_original(state)
    converted = from_original(original)
    assert sorted(converted) == sorted(state)
    for key, value in state.items():
        assert torch.equal(converted[key], value), key
    # The tiny models have each kind of block: the pre-only last one, and dual attention.
    config = sd3_config(variant)
    last = config["num_layers"] - 1
    assert f"joint_blocks.{last}.context_block.attn.proj.weight" not in original
    assert original[f"joint_blocks.{last}.context_block.adaLN_modulation.1.weight"].shape[0] == (
        2 * config["caption_projection_dim"]
    )
    assert any(".attn2." in k for k in original) == (variant == "sd3.5-medium")
    assert any(".ln_q." in k for k in original) == (variant != "sd3-medium")


# (a) names --------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_names_are_kohyas_for_every_linear_of_the_original_blocks(variant):
    plain = build_sd3(variant)
    expected = kohya_expected(to_original(plain.state_dict()))
    modules = transformer_modules(plain)
    assert [(m.name, m.in_features, sum(m.out_features)) for m in modules] == expected
    assert [m.name for m in transformer_modules(meta_sd3(sd3_config(variant)))] == [
        name for name, _, _ in expected
    ]
    assert [m.name for m in modules if m.swapped_halves] == [
        f"lora_unet_joint_blocks_{sd3_config(variant)['num_layers'] - 1}_context_block_"
        "adaLN_modulation_1"
    ]
    # Every Linear inside diffusers' joint blocks is a part of exactly one kohya module.
    linears = sorted(
        path
        for path, layer in plain.named_modules()
        if isinstance(layer, torch.nn.Linear) and path.startswith("transformer_blocks.")
    )
    assert target_paths(modules) == linears


def test_full_size_module_counts_and_kohya_options():
    # The released MMDiTs (diffusers' transformer/config.json): width 64 x depth, one head per
    # block; SD3.5 Medium's blocks 0-12 have dual attention.
    base = {"patch_size": 2, "in_channels": 16, "out_channels": 16, "attention_head_dim": 64}
    base |= {"joint_attention_dim": 4096, "pooled_projection_dim": 2048, "sample_size": 128}
    configs = {
        "sd3-medium": dict(base, num_layers=24, num_attention_heads=24),
        "sd3.5-medium": dict(
            base, num_layers=24, num_attention_heads=24, dual_attention_layers=tuple(range(13))
        ),
        "sd3.5-large": dict(base, num_layers=38, num_attention_heads=38),
    }
    # 23 (37) joint blocks of 10 Linears and the pre-only one of 7; 13 dual blocks add 2 each.
    counts = {"sd3-medium": 237, "sd3.5-medium": 263, "sd3.5-large": 377}
    for variant, config in configs.items():
        config["caption_projection_dim"] = 64 * config["num_layers"]
        if variant != "sd3-medium":
            config["qk_norm"] = "rms_norm"
        modules = transformer_modules(meta_sd3(config))
        assert len(modules) == counts[variant], variant
        assert (
            modules[-1].name == f"lora_unet_joint_blocks_{config['num_layers'] - 1}_x_block_"
            "adaLN_modulation_1"
        )
    transformer = meta_sd3(sd3_config("sd3.5-medium"))
    every = [m.name for m in transformer_modules(transformer)]
    no_mod = [m.name for m in transformer_modules(transformer, modulation=False)]
    assert no_mod == [n for n in every if "adaLN_modulation" not in n]
    picked = [m.name for m in transformer_modules(transformer, block_indices={0, 2})]
    assert picked == [n for n in every if not n.startswith("lora_unet_joint_blocks_1_")]


def test_text_encoder_names():
    clip_l, clip_g = build_clip(16, 2, seed=0), build_clip(24, 3, seed=1)
    parts = ["self_attn_q_proj", "self_attn_k_proj", "self_attn_v_proj", "self_attn_out_proj"]
    parts += ["mlp_fc1", "mlp_fc2"]
    for model, prefix, layers in ((clip_l, CLIP_L, 2), (clip_g, CLIP_G, 3)):
        names = {m.name for m in text_encoder_modules(model, prefix)}
        assert names == {
            f"{prefix}_text_model_encoder_layers_{i}_{part}"
            for i in range(layers)
            for part in parts
        }
        # The plain kohya writer (library.networks.kohya_keys) names adapted CLIPs the same way.
        model = copy.deepcopy(model)
        adapt(model, target_paths(text_encoder_modules(model, prefix)), rank=2, alpha=1.0)
        assert set(kohya_keys.name_table(prefix, model)) == names


# (b) the kohya file merged into the original weights is the diffusers model's merge ------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_kohya_file_merged_into_original_weights_matches_peft_merge(variant):
    plain = build_sd3(variant)
    modules = transformer_modules(plain)
    ours = adapted(plain, modules, seed=1)
    tensors = export_lora(modules, adapter_weights(ours))
    # What kohya and ComfyUI do with the file: W_original += alpha / rank * up @ down.
    original = to_original(plain.state_dict())
    table = comfy_table(original)
    names = {key.split(".")[0] for key in tensors}
    assert names == {m.name for m in modules} and names <= set(table)
    with torch.no_grad():
        for name in names:
            down = tensors[f"{name}.lora_down.weight"].double()
            up = tensors[f"{name}.lora_up.weight"].double()
            alpha = float(tensors[f"{name}.alpha"])
            weight = original[table[name]]
            original[table[name]] = (weight.double() + alpha / down.shape[0] * up @ down).float()
    converted = from_original(original)
    merged = peft_merged(ours)
    assert sorted(converted) == sorted(merged)
    for key, value in merged.items():
        torch.testing.assert_close(converted[key], value, rtol=1e-5, atol=1e-6, msg=key)
    # The adapters changed every adapted weight, the pre-only modulation included.
    last = sd3_config(variant)["num_layers"] - 1
    key = f"transformer_blocks.{last}.norm1_context.linear.weight"
    assert (merged[key] - plain.state_dict()[key]).abs().max() > 1e-3


@pytest.mark.parametrize("variant", ["sd3-medium", "sd3.5-medium"])
def test_kohya_dense_file_imports_as_its_original_merge(variant):
    """A file as kohya writes it (one dense LoRA per original Linear, rows in the original
    order) gives adapters whose merge is the file merged into the original weights."""
    plain = build_sd3(variant)
    modules = transformer_modules(plain)
    original = to_original(plain.state_dict())
    table = comfy_table(original)
    gen = torch.Generator().manual_seed(2)
    tensors = {}
    with torch.no_grad():
        for index, (name, in_features, out_features) in enumerate(kohya_expected(original)):
            rank, alpha = 3, 1.0 + index % 4
            down = torch.randn(rank, in_features, generator=gen) * 0.1
            up = torch.randn(out_features, rank, generator=gen) * 0.1
            tensors |= {f"{name}.lora_down.weight": down, f"{name}.lora_up.weight": up}
            tensors[f"{name}.alpha"] = torch.tensor(alpha)
            original[table[name]] += alpha / rank * (up @ down)
    expected = from_original(original)
    weights = import_lora(modules, tensors, "kohya.safetensors")
    assert sorted(weights) == target_paths(modules)
    model = copy.deepcopy(plain)
    adapt(model, target_paths(modules), rank=3, alpha=3.0)
    load_adapter_weights(model, weights, "kohya.safetensors")
    merged = peft_merged(model)
    for key, value in expected.items():
        torch.testing.assert_close(merged[key], value, rtol=1e-5, atol=1e-6, msg=key)


# (c) round trips --------------------------------------------------------------------------------


def test_diffusers_layout_round_trip(tmp_path):
    plain = build_sd3("sd3.5-medium")
    modules = transformer_modules(plain)
    ours = adapted(plain, modules, seed=4)
    clip_l = copy.deepcopy(build_clip(16, 2, seed=5))
    adapt(clip_l, target_paths(text_encoder_modules(clip_l, CLIP_L)), rank=2, alpha=1.0)
    randomize_lora(clip_l, torch.Generator().manual_seed(6), std=0.1)
    models = {TRANSFORMER: ours, CLIP_L: clip_l}
    tensors = diffusers_lora_tensors(models)
    assert is_diffusers_layout(tensors) and not is_diffusers_layout(
        export_lora(modules, adapter_weights(ours))
    )
    # No alphas: the scale is inside lora_B.
    assert all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in tensors)
    key = "transformer_blocks.0.attn2.to_q"
    down, up, alpha = adapter_weights(ours)[key]
    assert torch.equal(tensors[f"transformer.{key}.lora_A.weight"], down)
    torch.testing.assert_close(tensors[f"transformer.{key}.lora_B.weight"], alpha / 4 * up)
    assert "text_encoder.text_model.encoder.layers.1.mlp.fc2.lora_B.weight" in tensors
    path = save_lora_file(tmp_path / "d.safetensors", tensors, {}, torch.float32)
    # read_lora_file takes kohya files only (library/saving/lora_file.py); read it plainly.
    loaded = load_file(str(path))
    fresh = {TRANSFORMER: copy.deepcopy(plain), CLIP_L: build_clip(16, 2, seed=5)}
    adapt(fresh[TRANSFORMER], target_paths(modules), rank=4, alpha=1.0)
    adapt(fresh[CLIP_L], target_paths(text_encoder_modules(clip_l, CLIP_L)), rank=2, alpha=1.0)
    weights = import_diffusers_lora(fresh, loaded, str(path))
    assert set(weights) == {TRANSFORMER, CLIP_L}
    for prefix, model in fresh.items():
        load_adapter_weights(model, weights[prefix], str(path))
    # Written again, the file is the same; merged, the models are.
    again = diffusers_lora_tensors(fresh)
    assert sorted(again) == sorted(tensors)
    for key, value in tensors.items():
        assert torch.equal(again[key], value), key
    for prefix, model in fresh.items():
        theirs, mine = peft_merged(model), peft_merged(models[prefix])
        for key, value in mine.items():
            torch.testing.assert_close(theirs[key], value, rtol=1e-6, atol=1e-7, msg=key)


def test_diffusers_layout_alphas_come_from_the_header_diffusers_writes():
    """A peft file with diffusers' lora_adapter_metadata header (lora_alpha 8 at r 4, one
    module's alpha_pattern 2): each module reads peft's alpha, not rank (which is scale 1)."""
    plain = build_sd3("sd3.5-medium")
    ours = adapted(plain, transformer_modules(plain), seed=4)
    tensors = diffusers_lora_tensors({TRANSFORMER: ours})
    key = "transformer_blocks.0.attn2.to_q"
    header = {
        "transformer.r": 4,
        "transformer.lora_alpha": 8,
        "transformer.alpha_pattern": {key: 2},
    }
    metadata = {"lora_adapter_metadata": json.dumps(header)}
    weights = import_diffusers_lora({TRANSFORMER: ours}, tensors, "d.safetensors", metadata)
    alphas = {path: alpha for path, (_, _, alpha) in weights[TRANSFORMER].items()}
    assert alphas.pop(key) == 2.0
    assert alphas and set(alphas.values()) == {8.0}
    bare = import_diffusers_lora({TRANSFORMER: ours}, tensors, "d.safetensors")[TRANSFORMER]
    assert {alpha for _, _, alpha in bare.values()} == {4.0}  # no header: scale 1


# (d) diffusers' SD3 pipeline reads the diffusers-layout file ------------------------------------


def test_t5_adapters_have_no_diffusers_layout():
    from transformers import T5Config, T5EncoderModel

    t5 = T5EncoderModel(
        T5Config(d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, vocab_size=50)
    )
    adapt(t5, target_paths(text_encoder_modules(t5, T5)), rank=2, alpha=1.0)
    with pytest.raises(ValueError, match="train_t5xxl"):
        diffusers_lora_tensors({TRANSFORMER: meta_sd3(sd3_config("sd3-medium")), T5: t5})


# (e) refusals -----------------------------------------------------------------------------------


def test_kohya_import_refuses_files_of_other_models():
    small = transformer_modules(meta_sd3(sd3_config("sd3-medium")))
    dual = build_sd3("sd3.5-medium")
    dual_modules = transformer_modules(dual)
    tensors = export_lora(dual_modules, adapter_weights(adapted(dual, dual_modules, seed=12)))
    # attn2 is SD3.5 Medium's: not a module of SD3 Medium.
    with pytest.raises(CheckpointError, match=r"x\.safetensors.*lora_unet_joint_blocks_0_x_"):
        import_lora(small, tensors, "x.safetensors")
    # A block the model does not have.
    extra = dict(tensors)
    name = "lora_unet_joint_blocks_7_x_block_mlp_fc1"
    extra[f"{name}.lora_down.weight"] = torch.zeros(4, 32)
    extra[f"{name}.lora_up.weight"] = torch.zeros(128, 4)
    with pytest.raises(CheckpointError, match=f"x.safetensors.*{name}"):
        import_lora(dual_modules, extra, "x.safetensors")
    # Shapes of a wider model.
    name = "lora_unet_joint_blocks_2_context_block_adaLN_modulation_1"
    wide = dict(tensors)
    wide[f"{name}.lora_up.weight"] = torch.zeros(128, 4)
    with pytest.raises(CheckpointError, match=r"x\.safetensors.*different model"):
        import_lora(dual_modules, wide, "x.safetensors")


def test_diffusers_import_refuses_files_of_other_models():
    plain = build_sd3("sd3-medium")
    modules = transformer_modules(plain)
    ours = adapted(plain, modules, seed=13)
    tensors = diffusers_lora_tensors({TRANSFORMER: ours})
    models = {TRANSFORMER: plain}
    assert set(import_diffusers_lora(models, tensors, "d.safetensors")[TRANSFORMER]) == set(
        target_paths(modules)
    )
    cases = {
        "lacks": (
            {
                "transformer.transformer_blocks.0.attn2.to_q.lora_A.weight": torch.zeros(4, 32),
                "transformer.transformer_blocks.0.attn2.to_q.lora_B.weight": torch.zeros(32, 4),
            },
            "attn2.to_q is not a Linear",
        ),
        "shape": (
            {
                "transformer.transformer_blocks.0.attn.to_q.lora_B.weight": torch.zeros(64, 4),
            },
            "different model",
        ),
        "no B": (
            {"transformer.proj_out.lora_A.weight": torch.zeros(4, 32)},
            "no lora_B.weight",
        ),
        "kohya key": ({"lora_unet_x.alpha": torch.tensor(1.0)}, "not a diffusers/peft"),
        "T5": (
            {"text_encoder_3.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight": torch.ones(1)},
            "text_encoder_3",
        ),
        "untrained CLIP": (
            {"text_encoder.text_model.encoder.layers.0.mlp.fc1.lora_A.weight": torch.ones(1)},
            "network_train_unet_only = false",
        ),
    }
    for case, (change, message) in cases.items():
        with pytest.raises(CheckpointError, match=rf"d\.safetensors.*{message}"):
            import_diffusers_lora(models, tensors | change, "d.safetensors")
        print(case, "refused")
    with pytest.raises(CheckpointError, match="has LoRA weights but no adapter"):
        load_adapter_weights(
            copy.deepcopy(plain),
            import_diffusers_lora(models, tensors, "d.safetensors")[TRANSFORMER],
            "d.safetensors",
        )
