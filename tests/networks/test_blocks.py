"""kohya's block-wise network_args (library/models/families/sd/blocks.py), checked against
independent computations: block numbers counted off the UNets' own structure (full-size SD 1.5,
SD 2.x and SDXL built on the meta device, the tiny test UNets), a hand-written table of kohya's
SD 1.x rule, and the lr-weight curves' formulas."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from library.models.families.sd.blocks import (
    PRESETS,
    BlockRank,
    BlockwiseSpec,
    block_index,
    block_ranks,
    blockwise_spec,
    lr_weights,
    num_blocks,
    preset_weights,
)

# --- helpers ----------------------------------------------------------------------------------


def _meta_unet(folder: str):
    from diffusers import UNet2DConditionModel

    from library.models.families.sd.checkpoint_layout import CONFIGS_DIR

    config = json.loads((CONFIGS_DIR / folder / "unet.json").read_text())
    with torch.device("meta"):
        return UNet2DConditionModel.from_config(config)


def _tiny_unet(family: str):
    from diffusers import UNet2DConditionModel

    from tests.kits.sd.tiny import tiny_sdxl_unet_config, tiny_unet_config

    config = tiny_sdxl_unet_config() if family == "sdxl" else tiny_unet_config(family)
    with torch.device("meta"):
        return UNet2DConditionModel(**config)


def _target_names(unet) -> dict[str, str]:
    """kohya name -> diffusers path of every layer a LoRA with conv adapts (difftune's naming)."""
    from library.models.families.registry import unet_key_layout
    from library.networks.kohya_names import kohya_name, kohya_path
    from library.networks.targets import default_targets

    paths = default_targets(unet, "unet", conv=True)
    return {kohya_name("lora_unet", kohya_path(unet, p, unet_key_layout)): p for p in paths}


def _counted_blocks(unet) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """(input, middle, output) block number of each container of ``unet``, counted the way the
    original layout numbers them: input block 0 is conv_in, then each ResNet (with its
    attention) and each downsampler takes the next input block; each up ResNet (with its
    attention) takes the next output block and the upsampler joins the level's last one; the
    middle is ResNet, attention, ResNet."""
    inputs, middle, outputs = {}, {}, {}
    number = 1
    for i, down in enumerate(unet.down_blocks):
        for j in range(len(down.resnets)):
            inputs[f"down_blocks.{i}.resnets.{j}"] = number
            if getattr(down, "attentions", None):
                inputs[f"down_blocks.{i}.attentions.{j}"] = number
            number += 1
        if down.downsamplers:
            inputs[f"down_blocks.{i}.downsamplers.0"] = number
            number += 1
    middle = {"mid_block.resnets.0": 0, "mid_block.attentions.0": 1, "mid_block.resnets.1": 2}
    number = 0
    for i, up in enumerate(unet.up_blocks):
        for j in range(len(up.resnets)):
            outputs[f"up_blocks.{i}.resnets.{j}"] = number
            if getattr(up, "attentions", None):
                outputs[f"up_blocks.{i}.attentions.{j}"] = number
            number += 1
        if up.upsamplers:
            outputs[f"up_blocks.{i}.upsamplers.0"] = number - 1
    return inputs, middle, outputs


def _container(path: str, table: dict[str, int]) -> str:
    (found,) = [c for c in table if path.startswith(c + ".")]
    return found


def _expected_index(path: str, counted, sdxl: bool) -> int:
    """kohya's index from the counted block numbers: SD 1.x/2.x input k -> k, middle -> 12,
    output k -> 13 + k; SDXL input k -> 1 + k, middle m -> 10 + m, output k -> 13 + k."""
    inputs, middle, outputs = counted
    for table, first_sd, first_sdxl in ((inputs, 0, 1), (middle, 12, 10), (outputs, 13, 13)):
        hits = [c for c in table if path.startswith(c + ".")]
        if hits:
            number = table[hits[0]]
            if not sdxl and table is middle:
                return 12
            return (first_sdxl if sdxl else first_sd) + number
    raise AssertionError(f"{path} is in no counted block")


# --- block_index ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("folder", "sdxl", "inputs", "outputs", "indices"),
    [
        ("sd15", False, 12, 12, set(range(1, 25))),
        ("sd2-768-v", False, 12, 12, set(range(1, 25))),
        # input block 0 (conv_in) has no LoRA: 2-9, middle 10-12, output 13-21
        ("sdxl-base", True, 9, 9, set(range(2, 22))),
    ],
)
def test_block_index_of_full_size_unets(folder, sdxl, inputs, outputs, indices):
    unet = _meta_unet(folder)
    counted = _counted_blocks(unet)
    # the layout kohya's table is made for: 12 (SDXL 9) input and output blocks
    assert max(counted[0].values()) + 1 == inputs
    assert max(counted[2].values()) + 1 == outputs
    names = _target_names(unet)
    assert len(names) == (788 if sdxl else 278)
    got = {name: block_index(name, sdxl) for name in names}
    expected = {name: _expected_index(path, counted, sdxl) for name, path in names.items()}
    assert got == expected
    assert set(got.values()) == indices


def test_block_index_of_the_tiny_sdxl_unet():
    unet = _tiny_unet("sdxl")
    counted = _counted_blocks(unet)
    names = _target_names(unet)
    expected = {name: _expected_index(path, counted, True) for name, path in names.items()}
    assert {name: block_index(name, True) for name in names} == expected
    # 2 levels: input blocks 1-5 (conv_in is 0), middle 0-2, output blocks 0-5
    assert set(expected.values()) == {2, 3, 4, 5, 6, 10, 11, 12, 13, 14, 15, 16, 17, 18}


# kohya's SD 1.x/2.x rule applies to names, as if every level had SD's two ResNets: the tiny
# UNet (one ResNet per down level, two per up level) gets these numbers, written by hand from
# down_blocks.i.{resnets,attentions}.j -> 1+3i+j, downsamplers -> 3+3i, mid -> 12,
# up_blocks.i.{resnets,attentions}.j -> 13+3i+j, upsamplers -> 15+3i.
TINY_SD1 = {
    "down_blocks.0.resnets.0": 1,
    "down_blocks.0.attentions.0": 1,
    "down_blocks.0.downsamplers.0": 3,
    "down_blocks.1.resnets.0": 4,
    "mid_block.resnets.0": 12,
    "mid_block.attentions.0": 12,
    "mid_block.resnets.1": 12,
    "up_blocks.0.resnets.0": 13,
    "up_blocks.0.resnets.1": 14,
    "up_blocks.0.upsamplers.0": 15,
    "up_blocks.1.resnets.0": 16,
    "up_blocks.1.attentions.0": 16,
    "up_blocks.1.resnets.1": 17,
    "up_blocks.1.attentions.1": 17,
}


def test_block_index_of_the_tiny_sd1_unet():
    names = _target_names(_tiny_unet("sd1"))
    containers = {name: _container(path, TINY_SD1) for name, path in names.items()}
    assert set(containers.values()) == set(TINY_SD1)
    assert {n: block_index(n, False) for n in names} == {
        n: TINY_SD1[c] for n, c in containers.items()
    }


@pytest.mark.parametrize(
    ("name", "sdxl", "index"),
    [
        ("lora_unet_down_blocks_0_attentions_0_proj_in", False, 1),
        ("lora_unet_down_blocks_0_resnets_1_conv1", False, 2),
        ("lora_unet_down_blocks_0_downsamplers_0_conv", False, 3),
        ("lora_unet_down_blocks_1_attentions_0_proj_in", False, 4),
        ("lora_unet_down_blocks_3_resnets_1_time_emb_proj", False, 11),
        ("lora_unet_mid_block_attentions_0_proj_out", False, 12),
        ("lora_unet_mid_block_resnets_1_conv2", False, 12),
        ("lora_unet_up_blocks_0_resnets_0_conv1", False, 13),
        ("lora_unet_up_blocks_0_upsamplers_0_conv", False, 15),
        ("lora_unet_up_blocks_1_attentions_2_transformer_blocks_0_attn2_to_k", False, 18),
        ("lora_unet_up_blocks_3_attentions_2_proj_out", False, 24),
        ("lora_unet_time_embed_0", True, 0),
        ("lora_unet_label_emb_0_0", True, 0),
        ("lora_unet_input_blocks_0_0", True, 1),
        ("lora_unet_input_blocks_3_0_op", True, 4),
        ("lora_unet_input_blocks_4_1_proj_in", True, 5),
        ("lora_unet_input_blocks_8_1_transformer_blocks_9_attn1_to_q", True, 9),
        ("lora_unet_middle_block_0_in_layers_2", True, 10),
        ("lora_unet_middle_block_1_proj_in", True, 11),
        ("lora_unet_middle_block_2_emb_layers_1", True, 12),
        ("lora_unet_output_blocks_0_1_proj_out", True, 13),
        ("lora_unet_output_blocks_2_2_conv", True, 15),
        ("lora_unet_output_blocks_8_0_skip_connection", True, 21),
        ("lora_unet_out_2", True, 22),
    ],
)
def test_block_index_examples(name, sdxl, index):
    assert block_index(name, sdxl) == index


@pytest.mark.parametrize(
    ("name", "sdxl"),
    [
        ("lora_unet_conv_in", False),
        ("lora_unet_conv_out", False),
        ("lora_unet_conv_norm_out", False),
        ("lora_unet_time_embedding_linear_1", False),
        ("lora_unet_add_embedding_linear_1", False),
        ("lora_te_text_model_encoder_layers_0_mlp_fc1", False),
        ("lora_unet_input_blocks_4_1_proj_in", False),  # an SDXL name
        ("lora_te1_text_model_encoder_layers_0_mlp_fc1", True),
        ("lora_te2_text_model_encoder_layers_0_self_attn_q_proj", True),
        ("lora_unet_down_blocks_1_attentions_0_proj_in", True),  # a diffusers name on SDXL
        ("lora_unet_mid_block_attentions_0_proj_in", True),
        ("not_a_kohya_name", True),
    ],
)
def test_names_outside_the_numbered_blocks(name, sdxl):
    assert block_index(name, sdxl) is None


@pytest.mark.parametrize(
    ("name", "sdxl", "part"),
    [
        ("lora_unet_down_blocks_4_resnets_0_conv1", False, "down_blocks.4.resnets.0"),
        ("lora_unet_down_blocks_0_resnets_2_conv1", False, "down_blocks.0.resnets.2"),
        ("lora_unet_down_blocks_3_downsamplers_0_conv", False, "down_blocks.3.downsamplers.0"),
        ("lora_unet_down_blocks_0_downsamplers_1_conv", False, "down_blocks.0.downsamplers.1"),
        ("lora_unet_up_blocks_0_attentions_3_proj_in", False, "up_blocks.0.attentions.3"),
        ("lora_unet_up_blocks_4_upsamplers_0_conv", False, "up_blocks.4.upsamplers.0"),
        ("lora_unet_input_blocks_9_0_in_layers_2", True, "input_blocks.9"),
        ("lora_unet_middle_block_3_in_layers_2", True, "middle_block.3"),
        ("lora_unet_output_blocks_9_1_proj_in", True, "output_blocks.9"),
    ],
)
def test_block_numbers_past_kohyas_table_are_refused(name, sdxl, part):
    with pytest.raises(ValueError, match="has no block in kohya's") as err:
        block_index(name, sdxl)
    assert part in str(err.value) and "remove them" in str(err.value)


def test_num_blocks():
    assert num_blocks(False) == 12 + 1 + 12
    assert num_blocks(True) == 1 + 9 + 3 + 9 + 1


# --- lr weights -------------------------------------------------------------------------------


def _formula(name: str, n: int, offset: float) -> list[float]:
    x = [i / (n - 1) for i in range(n)]
    curve = {
        "sine": [math.sin(math.pi / 2 * v) for v in x],
        "cosine": [math.cos(math.pi / 2 * v) for v in x],
        "linear": x,
        "reverse_linear": [1 - v for v in x],
        "zeros": [0.0] * n,
    }[name]
    return [c + offset for c in curve]


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("offset", [0.0, 0.5, -0.25])
@pytest.mark.parametrize("n", [12, 9])
def test_presets_follow_their_formulas(name, offset, n):
    assert preset_weights(name, n, offset) == pytest.approx(_formula(name, n, offset), abs=1e-12)


def test_cosine_ends_at_exactly_zero():
    # kohya's "cosine" is the sine curve reversed, so its deepest value is 0, not cos(pi/2)
    assert preset_weights("cosine", 12)[-1] == 0.0
    assert preset_weights("sine", 12)[0] == 0.0


def test_unknown_preset_name():
    with pytest.raises(ValueError, match="unknown lr-weight preset 'cos'"):
        preset_weights("cos", 12)


@pytest.mark.parametrize("sdxl", [False, True])
def test_presets_fill_their_side(sdxl):
    n = 9 if sdxl else 12
    got = lr_weights("sine+0.5", None, "reverse_linear", sdxl=sdxl)
    assert len(got) == num_blocks(sdxl)
    head = [1.0] if sdxl else []
    tail = [1.0] if sdxl else []
    down = _formula("sine", n, 0.5)
    # reverse_linear's last value is 0: at the default threshold (0) it becomes 0
    up = _formula("reverse_linear", n, 0.0)
    mid = [1.0] * (3 if sdxl else 1)
    assert got == pytest.approx(head + down + mid + up + tail, abs=1e-12)
    assert got[-1 - len(tail)] == 0.0


def test_nothing_set_means_no_block_lr():
    assert lr_weights(None, None, None, sdxl=False) is None
    assert lr_weights(None, None, None, 0.5, sdxl=True) is None


@pytest.mark.parametrize(
    "down",
    [
        tuple(range(12)),
        list(range(12)),
        ",".join(str(i) for i in range(12)),
        "(" + ",".join(str(i) for i in range(12)) + ")",
    ],
)
def test_list_forms(down):
    got = lr_weights(down, None, None, sdxl=False)
    # input block 0's weight 0 stays 0 (it is at the threshold); the rest as given
    assert got == [float(i) for i in range(12)] + [1.0] * 13


def test_one_number_sets_every_block_of_its_side():
    assert lr_weights(0.5, None, 2, sdxl=False) == [0.5] * 12 + [1.0] + [2.0] * 12
    assert lr_weights("0.5", None, None, sdxl=True) == [1.0] + [0.5] * 9 + [1.0] * 13


def test_a_short_list_is_filled_with_ones(caplog):
    with caplog.at_level(logging.WARNING, logger="library.models.families.sd.blocks"):
        got = lr_weights((0.5, 0.25), None, None, sdxl=False)
    assert got == [0.5, 0.25] + [1.0] * 10 + [1.0] * 13
    assert "down_lr_weight has 2 of 12 values" in caplog.text


def test_mid_weights(caplog):
    assert lr_weights(None, 0.5, None, sdxl=False) == [1.0] * 12 + [0.5] + [1.0] * 12
    got = lr_weights(None, (0.1, 0.2, 0.3), None, sdxl=True)
    assert got == [1.0] * 10 + [0.1, 0.2, 0.3] + [1.0] * 10
    with caplog.at_level(logging.WARNING, logger="library.models.families.sd.blocks"):
        got = lr_weights(None, 0.5, None, sdxl=True)
    # one number on SDXL is the first middle block's; kohya fills the other two with 1
    assert got == [1.0] * 10 + [0.5, 1.0, 1.0] + [1.0] * 10
    assert "mid_lr_weight has 1 of 3 values" in caplog.text


def test_threshold_zeroes_weights_at_or_below_it():
    down = (0.0, 0.1, 0.2, 0.3, -0.5, 1.0, 0.2, 0.25, 2.0, 0.0, 0.5, 0.9)
    got = lr_weights(down, 0.2, None, 0.2, sdxl=False)
    expected_down = [w if w > 0.2 else 0.0 for w in down]
    assert expected_down == [0.0, 0.0, 0.0, 0.3, 0.0, 1.0, 0.0, 0.25, 2.0, 0.0, 0.5, 0.9]
    # mid 0.2 is at the threshold: 0; the unset up side keeps 1
    assert got == expected_down + [0.0] + [1.0] * 12


def test_negative_weights_become_zero_at_the_default_threshold():
    assert lr_weights(None, -1, None, sdxl=False)[12] == 0.0


def test_threshold_spares_unset_sides_and_sdxl_ends():
    got = lr_weights("zeros+1.5", None, None, 2, sdxl=True)
    # every down weight (1.5) is below 2: 0; unset middle/output and the two ends stay 1
    assert got == [1.0] + [0.0] * 9 + [1.0] * 3 + [1.0] * 9 + [1.0]
    # filled-in values are thresholded with their list (kohya fills before thresholding)
    assert lr_weights((3,), None, None, 2, sdxl=False)[:3] == [3.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("args", "sdxl", "needles"),
    [
        ((tuple([1] * 13), None, None), False, ["down_lr_weight has 13 values, 1 too many", "12"]),
        # an SD 1.x list on SDXL
        ((None, None, tuple([1] * 12)), True, ["up_lr_weight has 12 values, 3 too many", "give 9"]),
        (((1,) * 10, None, None), True, ["give 9 numbers", "SDXL input block 0-8", "preset"]),
        ((None, (1, 1), None), False, ["mid_lr_weight has 2 values, 1 too many", "give 1 number"]),
        ((None, (1, 1, 1, 1), None), True, ["mid_lr_weight has 4 values", "give 3 numbers"]),
        (("cosin", None, None), False, ['down_lr_weight "cosin" is not a number', "cosine+0.5"]),
        (("cosine+x", None, None), False, ['down_lr_weight "cosine+x": the offset after "+"']),
        (("zeros+0.5+1", None, None), False, ["the offset after", '"zeros+0.5"']),
        (("linear+inf", None, None), False, ["the offset after"]),
        ((None, "cosine", None), False, ['mid_lr_weight "cosine" is a preset', "give 1 number"]),
        ((None, "sine+1", None), True, ["is a preset", "give 3 numbers"]),
        ((True, None, None), False, ["down_lr_weight true is not a number"]),
        ((None, None, (1, "x")), False, ['up_lr_weight "x" is not a number']),
        ((None, None, (1, float("nan"))), False, ["up_lr_weight NaN is not a finite number"]),
        (((), None, None), False, ["down_lr_weight is an empty list"]),
        (("1,,2", None, None), False, ["has an empty value in its list"]),
        (({"a": 1}, None, None), False, ["down_lr_weight", "is not a number"]),
    ],
)
def test_lr_weight_errors(args, sdxl, needles):
    with pytest.raises(ValueError) as err:
        lr_weights(*args, sdxl=sdxl)
    for needle in needles:
        assert needle in str(err.value)


@pytest.mark.parametrize("threshold", ["abc", True, float("inf")])
def test_bad_threshold(threshold):
    with pytest.raises(ValueError, match="block_lr_zero_threshold .* number; give one number"):
        lr_weights(None, 1, None, threshold, sdxl=False)


# --- block ranks ------------------------------------------------------------------------------


@pytest.mark.parametrize("sdxl", [False, True])
def test_rank_defaults(sdxl):
    n = num_blocks(sdxl)
    assert (
        block_ranks(None, None, None, None, 8, 4, sdxl=sdxl) == (BlockRank(8, 4.0, None, None),) * n
    )
    # conv_dim: every block, conv_alpha defaulting to 1
    assert (
        block_ranks(None, None, None, None, 8, 4, 2, sdxl=sdxl) == (BlockRank(8, 4.0, 2, 1.0),) * n
    )
    got = block_ranks(None, None, None, None, 8, 4, 2, 3, sdxl=sdxl)
    assert got == (BlockRank(8, 4.0, 2, 3.0),) * n


def test_per_block_lists():
    dims = tuple(range(25))
    alphas = tuple(float(i) + 0.5 for i in range(25))
    conv = tuple(i % 3 for i in range(25))
    conv_alphas = ",".join(str(i + 1) for i in range(25))
    got = block_ranks(dims, alphas, conv, conv_alphas, 8, 4, sdxl=False)
    assert got == tuple(BlockRank(i, i + 0.5, i % 3, float(i + 1)) for i in range(25))


def test_conv_block_dims_alone_take_conv_alpha_or_one():
    conv = (4,) * 23
    got = block_ranks(None, None, conv, None, 8, 4, sdxl=True)
    assert {(r.conv_dim, r.conv_alpha) for r in got} == {(4, 1.0)}
    # conv_block_dims wins over conv_dim; conv_alpha is the alpha of each block
    got = block_ranks(None, None, conv, None, 8, 4, 16, 2, sdxl=True)
    assert {(r.conv_dim, r.conv_alpha) for r in got} == {(4, 2.0)}


@pytest.mark.parametrize(
    "key", ["block_dims", "block_alphas", "conv_block_dims", "conv_block_alphas"]
)
@pytest.mark.parametrize(("sdxl", "n"), [(False, 25), (True, 23)])
def test_rank_lists_need_one_value_per_block(key, sdxl, n):
    args = {k: None for k in ("block_dims", "block_alphas", "conv_block_dims", "conv_block_alphas")}
    if key == "conv_block_alphas":
        args["conv_block_dims"] = (1,) * n
    args[key] = (1,) * (n - 1)
    with pytest.raises(ValueError) as err:
        block_ranks(*args.values(), 8, 4, sdxl=sdxl)
    message = str(err.value)
    assert message.startswith(f"{key} has {n - 1} values; give {n} values")
    assert ("output blocks 0-8 and the out layer" if sdxl else "output blocks 0-11") in message


def test_one_number_is_a_list_of_one():
    with pytest.raises(ValueError, match="block_dims has 1 values; give 25 values"):
        block_ranks(8, None, None, None, 8, 4, sdxl=False)


def test_conv_block_alphas_need_conv_block_dims():
    with pytest.raises(
        ValueError, match="conv_block_alphas is only read together with conv_block_dims"
    ):
        block_ranks(None, None, None, (1,) * 25, 8, 4, 4, sdxl=False)


@pytest.mark.parametrize("bad", [-1, 2.5, True, "x"])
def test_ranks_are_whole_numbers(bad):
    dims = [4] * 25
    dims[3] = bad
    with pytest.raises(ValueError, match="block_dims"):
        block_ranks(dims, None, None, None, 8, 4, sdxl=False)
    with pytest.raises(ValueError, match="conv_block_dims"):
        block_ranks(None, None, dims, None, 8, 4, sdxl=False)


def test_fractional_rank_message():
    dims = [4] * 25
    dims[3] = 2.5
    with pytest.raises(ValueError, match=r"block_dims value 3 \(block 3\) is 2.5; ranks are whole"):
        block_ranks(dims, None, None, None, 8, 4, sdxl=False)


def test_alphas_must_be_positive_where_the_block_has_a_rank():
    dims, alphas = [4] * 25, [1.0] * 25
    dims[5], alphas[5] = 0, 0.0  # a left-out block may have any alpha
    block_ranks(dims, alphas, None, None, 8, 4, sdxl=False)
    alphas[6] = 0.0
    with pytest.raises(ValueError, match=r"block_alphas value 6 \(block 6\) is 0.0 but the block"):
        block_ranks(dims, alphas, None, None, 8, 4, sdxl=False)
    with pytest.raises(ValueError, match=r"conv_block_alphas value 6 \(block 6\)"):
        block_ranks(None, None, dims, alphas, 8, 4, sdxl=False)


# --- the whole setting ------------------------------------------------------------------------

SD_LINEAR = "lora_unet_down_blocks_1_attentions_0_proj_in"  # block 4
SD_CONV = "lora_unet_down_blocks_1_resnets_0_conv1"  # block 4
SD_TIME = "lora_unet_down_blocks_1_resnets_0_time_emb_proj"  # block 4, a Linear in a ResNet
SD_UP = "lora_unet_up_blocks_1_attentions_2_proj_out"  # block 18
TE = "lora_te_text_model_encoder_layers_0_self_attn_q_proj"


def test_no_blockwise_keys_means_no_spec(caplog):
    assert blockwise_spec({"conv_dim": 4}, dim=8, alpha=4, sdxl=False) is None
    with caplog.at_level(logging.WARNING, logger="library.models.families.sd.blocks"):
        assert blockwise_spec({"block_lr_zero_threshold": 0.5}, dim=8, alpha=4, sdxl=True) is None
    assert "block_lr_zero_threshold has no effect" in caplog.text


@pytest.mark.parametrize("key", ["block_alphas", "conv_block_dims", "conv_block_alphas"])
def test_rank_keys_alone_are_refused(key):
    with pytest.raises(ValueError) as err:
        blockwise_spec({key: (1,) * 25}, dim=8, alpha=4, sdxl=False)
    message = str(err.value)
    assert message.startswith(f"{key} is only read together with block_dims")
    assert "add block_dims (25 ranks)" in message and f"remove {key}" in message


def test_zero_weight_blocks_lose_their_modules():
    down = [1.0] * 12
    down[4] = 0
    spec = blockwise_spec(
        {"down_lr_weight": tuple(down), "up_lr_weight": "linear+0.5"},
        dim=8,
        alpha=4,
        conv_dim=2,
        sdxl=False,
    )
    assert spec.conv
    assert spec.ranks[4] == BlockRank(0, 4.0, 0, 1.0)
    for name, kind in ((SD_LINEAR, "linear"), (SD_CONV, "conv"), (SD_TIME, "linear")):
        assert spec.rank_alpha(name, kind) is None
        assert spec.dropped(name, kind)
    assert spec.rank_alpha("lora_unet_down_blocks_1_attentions_1_proj_in", "linear") == (8, 4.0)
    assert spec.rank_alpha("lora_unet_down_blocks_2_resnets_0_conv1", "conv") == (2, 1.0)
    assert spec.lr_weight(SD_UP) == pytest.approx(0.5 + 5 / 11)
    assert spec.lr_weight(SD_LINEAR) == 0.0
    assert spec.block(SD_UP) == 18


def test_text_encoder_modules_keep_the_network_rank():
    spec = blockwise_spec(
        {"block_dims": (2,) * 25, "down_lr_weight": "zeros"}, dim=8, alpha=4, sdxl=False
    )
    assert spec.block(TE) is None
    assert spec.rank_alpha(TE, "linear") == (8, 4.0)
    assert spec.lr_weight(TE) == 1.0
    assert not spec.dropped(TE, "linear")
    with pytest.raises(ValueError, match="a text-encoder module has no conv LoRA"):
        spec.rank_alpha(TE, "conv")
    sdxl = blockwise_spec({"mid_lr_weight": 0}, dim=8, alpha=4, sdxl=True)
    assert sdxl.rank_alpha("lora_te2_text_model_encoder_layers_3_mlp_fc1", "linear") == (8, 4.0)
    assert sdxl.dropped("lora_unet_middle_block_0_in_layers_2", "linear")
    assert not sdxl.dropped("lora_unet_middle_block_1_proj_in", "linear")


def test_block_dims_alone_keep_one_unet_rate():
    dims = tuple(range(25))
    spec = blockwise_spec(
        {"block_dims": dims, "block_alphas": (2,) * 25}, dim=8, alpha=4, sdxl=False
    )
    assert spec.lr_weights is None
    assert spec.lr_weight(SD_LINEAR) == 1.0
    assert spec.rank_alpha(SD_LINEAR, "linear") == (4, 2.0)
    assert spec.rank_alpha(SD_UP, "linear") == (18, 2.0)
    # a rank of 0 leaves the block out although its lr weight is 1
    assert spec.dropped("lora_unet_down_blocks_0_resnets_0_conv1", "conv")  # conv off
    zero = blockwise_spec({"block_dims": (0,) * 25}, dim=8, alpha=4, sdxl=False)
    assert zero.dropped(SD_LINEAR, "linear") and not zero.conv


def test_conv_ranks_of_zero_still_adapt_resnet_linears():
    # kohya targets the ResNet blocks once conv_block_dims is set; their Linear and 1x1 layers
    # take the block's linear rank even where the conv rank is 0
    spec = blockwise_spec(
        {"block_dims": (3,) * 25, "conv_block_dims": (0,) * 25}, dim=8, alpha=4, sdxl=False
    )
    assert spec.conv
    assert spec.rank_alpha(SD_CONV, "conv") is None
    assert spec.rank_alpha(SD_TIME, "linear") == (3, 4.0)


def test_spec_of_the_tiny_sd1_unet():
    """Every target of the tiny UNet, with one zero-weight up block and per-block ranks."""
    from library.networks.targets import default_targets

    unet = _tiny_unet("sd1")
    names = _target_names(unet)
    kinds = default_targets(unet, "unet", conv=True)
    up = [1.0] * 12
    up[1] = 0.0  # block 14: up_blocks.0.resnets.1
    dims = tuple(i + 1 for i in range(25))
    spec = blockwise_spec(
        {"up_lr_weight": tuple(up), "block_dims": dims, "conv_block_dims": dims},
        dim=8,
        alpha=4,
        sdxl=False,
    )
    for name, path in names.items():
        block = TINY_SD1[_container(path, TINY_SD1)]
        expected = None if block == 14 else (block + 1, 4.0 if kinds[path] == "linear" else 1.0)
        assert spec.rank_alpha(name, kinds[path]) == expected, name
        assert spec.lr_weight(name) == (0.0 if block == 14 else 1.0)


def test_names_the_spec_cannot_place():
    spec = blockwise_spec({"mid_lr_weight": 0.5}, dim=8, alpha=4, sdxl=False)
    for name in ("lora_unet_conv_in", "lora_unet_input_blocks_4_1_proj_in", "unet_x"):
        with pytest.raises(ValueError, match="is not in a block of kohya's SD 1.x/2.x numbering"):
            spec.rank_alpha(name, "linear")
    with pytest.raises(ValueError, match="unknown module kind 'attn'"):
        spec.rank_alpha(SD_LINEAR, "attn")
    with pytest.raises(ValueError, match="SDXL numbering"):
        blockwise_spec({"mid_lr_weight": 0.5}, dim=8, alpha=4, sdxl=True).lr_weight(SD_LINEAR)


def test_spec_needs_a_value_per_block():
    with pytest.raises(
        ValueError, match="SDXL block-wise settings have 23 blocks, got 25 ranks and no lr"
    ):
        BlockwiseSpec(
            sdxl=True,
            ranks=(BlockRank(1, 1.0, None, None),) * 25,
            lr_weights=None,
            dim=1,
            alpha=1.0,
        )
    with pytest.raises(ValueError, match="have 25 blocks, got 25 ranks and 1 lr weights"):
        BlockwiseSpec(
            sdxl=False,
            ranks=(BlockRank(1, 1.0, None, None),) * 25,
            lr_weights=(1.0,),
            dim=1,
            alpha=1.0,
        )


def test_spec_errors_name_the_key():
    with pytest.raises(ValueError, match="block_dims has 25 values; give 23 values"):
        blockwise_spec({"block_dims": (4,) * 25}, dim=8, alpha=4, sdxl=True)
    with pytest.raises(ValueError, match="down_lr_weight has 12 values, 3 too many"):
        blockwise_spec({"down_lr_weight": (1,) * 12}, dim=8, alpha=4, sdxl=True)
