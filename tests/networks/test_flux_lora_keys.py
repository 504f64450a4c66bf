"""Flux LoRA files in kohya's layout: names, fused (block-diagonal) modules, and other readers.

Every expectation comes from outside library/models/families/flux/lora_keys.py: the original Black
Forest Labs module tree written out by hand, diffusers' own kohya-Flux converter and LoRA loader,
and merges computed here (``W += alpha / r * up @ down``).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from library.errors import CheckpointError
from library.models.families.flux.lora_keys import (
    CLIP,
    T5,
    export_lora,
    import_lora,
    target_paths,
    text_encoder_modules,
    transformer_modules,
)
from tests.networks.flux_helpers import (
    DEV,
    TINY,
    WIDE_SINGLE,
    build_flux,
    capture_diffusers_warnings,
    flux_inputs,
    merge_by_hand,
    run_flux,
)

# The Linears of the original model's blocks (library/flux_models.py in sd-scripts):
# DoubleStreamBlock has, per stream (img, txt), a Modulation (.lin, 6 x hidden outputs), a
# SelfAttention (.qkv = q, k, v stacked, .proj) and a two-Linear MLP (Sequential 0 and 2);
# SingleStreamBlock has linear1 (q, k, v and the MLP input, 3 x hidden + 4 x hidden outputs),
# linear2 and a Modulation (3 x hidden outputs).
ORIGINAL_DOUBLE = [
    f"{stream}_{layer}"
    for stream in ("img", "txt")
    for layer in ("mod.lin", "attn.qkv", "attn.proj", "mlp.0", "mlp.2")
]
ORIGINAL_SINGLE = ["linear1", "linear2", "modulation.lin"]
ORIGINAL_EMBEDDERS = [
    "img_in",
    "time_in.in_layer",
    "time_in.out_layer",
    "vector_in.in_layer",
    "vector_in.out_layer",
    "guidance_in.in_layer",
    "guidance_in.out_layer",
    "txt_in",
]


def original_shapes(hidden: int) -> dict[str, tuple[int, list[int]]]:
    """Original block layer -> (in features, out rows of each part in diffusers' split)."""
    h = hidden
    shapes = {
        "linear1": (h, [h, h, h, 4 * h]),
        "linear2": (5 * h, [h]),
        "modulation.lin": (h, [3 * h]),
    }
    for stream in ("img", "txt"):
        shapes |= {
            f"{stream}_mod.lin": (h, [6 * h]),
            f"{stream}_attn.qkv": (h, [h, h, h]),
            f"{stream}_attn.proj": (h, [h]),
            f"{stream}_mlp.0": (h, [4 * h]),
            f"{stream}_mlp.2": (4 * h, [h]),
        }
    return shapes


def block_layer(original: str) -> str:
    """``double_blocks.3.img_attn.qkv`` -> ``img_attn.qkv``."""
    return original.split(".", 2)[2]


def expected_names(double: int, single: int, layers_d=ORIGINAL_DOUBLE, layers_s=ORIGINAL_SINGLE):
    names = [f"double_blocks.{i}.{layer}" for i in range(double) for layer in layers_d]
    names += [f"single_blocks.{i}.{layer}" for i in range(single) for layer in layers_s]
    return ["lora_unet_" + name.replace(".", "_") for name in names]


def random_weights(modules, seed: int, std: float = 0.05, uneven: str | None = None, ranks=(2, 4)):
    """Random (down, up, alpha) for every part; one rank and alpha per kohya module.

    Ranks alternate between ``ranks`` and alphas 1/2/3 across modules. The fused module named
    ``uneven`` gets ranks low, high, low, ... with alphas keeping one scale: unequal ranks.
    """
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for index, module in enumerate(modules):
        for part, (path, rows) in enumerate(zip(module.parts, module.out_features, strict=True)):
            rank, alpha = ranks[index % 2], 1.0 + index % 3
            if module.name == uneven:
                rank = ranks[part % 2]
                alpha = rank / ranks[0]
            down = torch.randn(rank, module.in_features, generator=gen) * std
            weights[path] = (down, torch.randn(rows, rank, generator=gen) * std, alpha)
    return weights


def meta_flux(config):
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        return FluxTransformer2DModel(**config)


def diffusers_state_dict(source):
    """diffusers' conversion of a kohya Flux file (path or dict), asserting it warned of nothing."""
    from diffusers import FluxPipeline

    if isinstance(source, dict):
        source = dict(source)  # the converter pops keys
    converted, noise = capture_diffusers_warnings(lambda: FluxPipeline.lora_state_dict(source))
    assert not noise, noise
    return converted


def converted_pair(converted, path):
    """(A, B) diffusers made for the transformer module at ``path``; scale alpha/r is inside."""
    return (
        converted[f"transformer.{path}.lora_A.weight"],
        converted[f"transformer.{path}.lora_B.weight"],
    )


@pytest.fixture(autouse=True)
def one_thread():
    """Run on one thread: the tests do thousands of small tensor ops, and on a busy machine
    threads waiting on each other made them ten times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Names ---------------------------------------------------------------------------------------


def test_flux_dev_default_names_are_the_original_paths():
    transformer = meta_flux(DEV)
    modules = transformer_modules(transformer)
    # kohya adapts every Linear of its 19 DoubleStreamBlocks (10 each) and 38 SingleStreamBlocks
    # (3 each): 19 x 10 + 38 x 3 = 304 modules, the count kohya logs for Flux.1 LoRA.
    assert len(modules) == 19 * 10 + 38 * 3 == 304
    assert [m.name for m in modules] == expected_names(19, 38)
    assert [m.original.replace(".", "_") for m in modules] == [m.name[10:] for m in modules]
    shapes = original_shapes(24 * 128)
    for module in modules:
        in_features, rows = shapes[block_layer(module.original)]
        assert (module.in_features, list(module.out_features)) == (in_features, rows), module
    # Every Linear inside diffusers' blocks is a part of exactly one kohya module.
    block_linears = sorted(
        path
        for path, layer in transformer.named_modules()
        if isinstance(layer, nn.Linear) and path.startswith(("transformer_blocks.", "single_"))
    )
    assert target_paths(modules) == block_linears
    assert len(block_linears) == 19 * 14 + 38 * 6


def test_flux_dev_kohya_options_select_like_kohya():
    transformer = meta_flux(DEV)
    no_mod_d = [layer for layer in ORIGINAL_DOUBLE if "mod" not in layer]
    no_mod_s = [layer for layer in ORIGINAL_SINGLE if "mod" not in layer]
    cases = {
        "double": (dict(train_blocks="double"), expected_names(19, 0)),
        "single": (dict(train_blocks="single"), expected_names(0, 38)),
        "no_mod": (dict(modulation=False), expected_names(19, 38, no_mod_d, no_mod_s)),
        "in_dims": (
            dict(embedders=True),
            expected_names(19, 38)
            + ["lora_unet_" + e.replace(".", "_") for e in ORIGINAL_EMBEDDERS],
        ),
    }
    for case, (options, names) in cases.items():
        assert [m.name for m in transformer_modules(transformer, **options)] == names, case
    picked = transformer_modules(transformer, double_indices={0, 18}, single_indices=set())
    assert [m.name for m in picked] == [
        n for n in expected_names(19, 0) if n.split("_")[4] in ("0", "18")
    ]
    schnell = meta_flux(dict(DEV, guidance_embeds=False))
    names = [m.name for m in transformer_modules(schnell, embedders=True)]
    assert not [n for n in names if "guidance" in n] and "lora_unet_txt_in" in names
    with pytest.raises(ValueError, match="train_blocks"):
        transformer_modules(transformer, train_blocks="blocks")


def test_text_encoder_names():
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    with torch.device("meta"):
        clip_l = CLIPTextModel(
            CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12)
        )
        t5_xxl = T5EncoderModel(  # google/t5-v1_1-xxl, Flux's T5
            T5Config(
                d_model=4096,
                d_kv=64,
                d_ff=10240,
                num_layers=24,
                num_heads=64,
                feed_forward_proj="gated-gelu",
                vocab_size=32128,
            )
        )
    clip_parts = ["self_attn_q_proj", "self_attn_k_proj", "self_attn_v_proj", "self_attn_out_proj"]
    clip_parts += ["mlp_fc1", "mlp_fc2"]
    names = {m.name for m in text_encoder_modules(clip_l, CLIP)}
    # transformers 4's path (text_model.encoder...), as kohya and ComfyUI name CLIP-L.
    assert names == {
        f"lora_te1_text_model_encoder_layers_{i}_{part}" for i in range(12) for part in clip_parts
    }
    t5_parts = [f"layer_0_SelfAttention_{p}" for p in "qkvo"]
    t5_parts += [f"layer_1_DenseReluDense_{p}" for p in ("wi_0", "wi_1", "wo")]
    names = {m.name for m in text_encoder_modules(t5_xxl, T5)}
    assert names == {f"lora_te3_encoder_block_{i}_{part}" for i in range(24) for part in t5_parts}
    assert len(names) == 24 * 7


# Export, and readers of the file ----------------------------------------------------------------


def test_original_layout_merge_gives_each_part_its_delta():
    """kohya and ComfyUI merge ``alpha / rank(down) * up @ down`` into the fused original weight."""
    transformer = build_flux(TINY)
    modules = transformer_modules(transformer)
    uneven = "lora_unet_double_blocks_1_txt_attn_qkv"
    weights = random_weights(modules, seed=3, uneven=uneven)
    tensors = export_lora(modules, weights)
    assert len(tensors) == 3 * len(modules)
    shapes = original_shapes(TINY["num_attention_heads"] * TINY["attention_head_dim"])
    for module in modules:
        name = module.name
        down, up = tensors[f"{name}.lora_down.weight"], tensors[f"{name}.lora_up.weight"]
        fused = float(tensors[f"{name}.alpha"]) / down.shape[0] * (up.double() @ down.double())
        rows = shapes[block_layer(module.original)][1]
        assert sum(rows) == fused.shape[0]
        for path, part_delta in zip(module.parts, torch.split(fused, rows), strict=True):
            down_p, up_p, alpha_p = weights[path]
            expected = alpha_p / down_p.shape[0] * (up_p.double() @ down_p.double())
            torch.testing.assert_close(part_delta, expected, rtol=1e-9, atol=1e-12)


def test_diffusers_converts_every_module_of_a_full_size_file():
    transformer = meta_flux(DEV)
    modules = transformer_modules(transformer)
    uneven = "lora_unet_single_blocks_5_linear1"
    weights = random_weights(modules, seed=4, uneven=uneven, ranks=(1, 2))
    converted = diffusers_state_dict(export_lora(modules, weights))
    expected = {
        f"transformer.{path}.lora_{ab}.weight" for path in target_paths(modules) for ab in "AB"
    }
    assert set(converted) == expected
    gen = torch.Generator().manual_seed(5)
    for module in modules:
        for path in module.parts:
            down, up, alpha = weights[path]
            a, b = converted_pair(converted, path)
            if module.fused and module.name != uneven:
                # diffusers saw the block-diagonal up and gave the part its own rank.
                assert a.shape[0] == down.shape[0], path
            # Same linear map: compare on random inputs (whole deltas would be 12B numbers).
            probe = torch.randn(module.in_features, 3, generator=gen, dtype=torch.float64)
            theirs = b.double() @ (a.double() @ probe)
            ours = alpha / down.shape[0] * (up.double() @ (down.double() @ probe))
            # float32 factors: errors relative to the largest entry, not each one.
            torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-6 * ours.abs().max().item())
    a, _ = converted_pair(converted, "single_transformer_blocks.5.attn.to_q")
    assert a.shape[0] == 1 + 2 + 1 + 2  # unequal ranks: diffusers keeps the dense reading


@pytest.mark.slow  # one Flux block at full width (3072): about 10 s of CPU by itself
def test_diffusers_runs_linear1_at_flux_width():
    plain = build_flux(WIDE_SINGLE)
    inputs = flux_inputs(WIDE_SINGLE, image_tokens=4, text_tokens=2)
    modules = transformer_modules(plain)
    assert [m.name for m in modules] == expected_names(0, 1)
    weights = random_weights(modules, seed=7, std=0.02)
    converted = diffusers_state_dict(export_lora(modules, weights))
    merged = copy.deepcopy(plain)
    merge_by_hand(merged, weights)
    expected = run_flux(merged, inputs)
    del merged
    plain.load_lora_adapter(converted, prefix="transformer")
    torch.testing.assert_close(run_flux(plain, inputs), expected, rtol=1e-5, atol=1e-5)
    plain.disable_adapters()
    assert (run_flux(plain, inputs) - expected).abs().max() > 1e-3


def test_diffusers_loads_clip_and_skips_t5_in_one_file():
    from diffusers import FluxPipeline
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    torch.manual_seed(0)
    clip = CLIPTextModel(
        CLIPTextConfig(
            hidden_size=32,
            intermediate_size=37,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=100,
            bos_token_id=0,
            eos_token_id=2,
            pad_token_id=1,
        )
    ).eval()
    t5 = T5EncoderModel(
        T5Config(
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            feed_forward_proj="gated-gelu",
            vocab_size=100,
        )
    )
    transformer = meta_flux(TINY)
    parts = {
        "transformer": [m for m in transformer_modules(transformer) if "linear1" not in m.name],
        "clip": text_encoder_modules(clip, CLIP),
        "t5": text_encoder_modules(t5, T5),
    }
    weights = {
        key: random_weights(mods, seed=8 + i, std=0.1)
        for i, (key, mods) in enumerate(parts.items())
    }
    tensors = {}
    for key, mods in parts.items():
        tensors.update(export_lora(mods, weights[key]))
    assert any(k.startswith("lora_te3_encoder_block_0_layer_0_SelfAttention_q.") for k in tensors)
    converted = diffusers_state_dict(tensors)
    # diffusers keeps lora_unet_/lora_te_/lora_te1_ names only; our T5 modules are dropped.
    assert {k.split(".")[0] for k in converted} == {"transformer", "text_encoder"}
    assert sum(k.startswith("transformer.") for k in converted) == 2 * len(
        target_paths(parts["transformer"])
    )
    text_part = {k: v for k, v in converted.items() if k.startswith("text_encoder.")}
    loaded = copy.deepcopy(clip)
    FluxPipeline.load_lora_into_text_encoder(text_part, None, loaded, prefix="text_encoder")
    merged = copy.deepcopy(clip)
    merge_by_hand(merged, weights["clip"])
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids)[0], merged(ids)[0], rtol=1e-5, atol=1e-5)
        assert (clip(ids)[0] - merged(ids)[0]).abs().max() > 1e-2


# Import ----------------------------------------------------------------------------------------


def test_dense_fused_kohya_file_gives_each_part_its_rows():
    """kohya's own fused modules: one down for q, k, v (and MLP), an up with no block structure."""
    transformer = build_flux(TINY)
    modules = transformer_modules(transformer)
    by_name = {m.name: m for m in modules}
    hidden = TINY["num_attention_heads"] * TINY["attention_head_dim"]
    shapes = original_shapes(hidden)
    gen = torch.Generator().manual_seed(11)
    tensors, fused = {}, {}
    for name, rank, alpha in (
        ("lora_unet_double_blocks_0_img_attn_qkv", 6, 3.0),  # rank divisible by 3, still dense
        ("lora_unet_single_blocks_1_linear1", 5, 8.0),
        ("lora_unet_double_blocks_1_img_mlp_0", 3, 1.5),
    ):
        module = by_name[name]
        down = torch.randn(rank, module.in_features, generator=gen)
        up = torch.randn(sum(module.out_features), rank, generator=gen)
        tensors |= {f"{name}.lora_down.weight": down, f"{name}.lora_up.weight": up}
        tensors[f"{name}.alpha"] = torch.tensor(alpha)
        fused[name] = alpha / rank * (up.double() @ down.double())
    no_alpha = "lora_unet_single_blocks_0_linear2"  # kohya's rule: no alpha means alpha = rank
    tensors[f"{no_alpha}.lora_down.weight"] = torch.randn(2, 5 * hidden, generator=gen)
    tensors[f"{no_alpha}.lora_up.weight"] = torch.randn(hidden, 2, generator=gen)
    fused[no_alpha] = (
        tensors[f"{no_alpha}.lora_up.weight"].double()
        @ tensors[f"{no_alpha}.lora_down.weight"].double()
    )
    weights = import_lora(modules, tensors, "kohya.safetensors")
    for name, delta in fused.items():
        rows = shapes[block_layer(by_name[name].original)][1]
        for path, expected in zip(by_name[name].parts, torch.split(delta, rows), strict=True):
            down, up, alpha = weights[path]
            if by_name[name].fused:
                assert down.shape[0] == tensors[f"{name}.lora_down.weight"].shape[0]
            torch.testing.assert_close(
                alpha / down.shape[0] * (up.double() @ down.double()), expected
            )
    assert len(weights) == 3 + 4 + 1 + 1


# Refusals --------------------------------------------------------------------------------------


def test_export_refuses_what_the_format_cannot_hold():
    transformer = meta_flux(TINY)
    modules = transformer_modules(transformer)
    weights = random_weights(modules, seed=12)
    q, k = "transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k"
    other_scale = dict(weights)
    other_scale[k] = (weights[k][0], weights[k][1], weights[k][2] * 2)
    with pytest.raises(ValueError, match="different scales"):
        export_lora(modules, other_scale)
    with pytest.raises(ValueError, match="all or none"):
        export_lora(modules, {p: w for p, w in weights.items() if p != q})
    with pytest.raises(ValueError, match="no kohya name"):
        export_lora(
            modules, weights | {"proj_out": weights["single_transformer_blocks.0.proj_out"]}
        )
    wrong = dict(weights)
    wrong[q] = (weights[q][0][:, :-1], weights[q][1], weights[q][2])
    with pytest.raises(ValueError, match="do not fit"):
        export_lora(modules, wrong)


def test_import_refuses_files_of_other_models():
    transformer = meta_flux(TINY)
    modules = transformer_modules(transformer)
    tensors = export_lora(modules, random_weights(modules, seed=13))
    with pytest.raises(CheckpointError, match="lora_unet_double_blocks_0_img_mod_lin"):
        import_lora(modules[1:], tensors, "x.safetensors")
    name = "lora_unet_single_blocks_0_linear1"
    wide = dict(tensors)
    wide[f"{name}.lora_up.weight"] = torch.zeros(21504, tensors[f"{name}.lora_up.weight"].shape[1])
    with pytest.raises(CheckpointError, match="different model"):
        import_lora(modules, wide, "x.safetensors")
    no_up = {k: v for k, v in tensors.items() if k != f"{name}.lora_up.weight"}
    with pytest.raises(CheckpointError, match="no lora_up.weight"):
        import_lora(modules, no_up, "x.safetensors")
