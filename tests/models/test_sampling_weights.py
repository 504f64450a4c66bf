"""Samples on another checkpoint's base weights (library/models/families/sampling_weights.py): the
other checkpoint's files, in the table's original names (bare or under ComfyUI's prefix) or in
diffusers', are checked against the loaded denoiser from their headers, swapped in for the
round with the adapters kept, and the denoiser's own weights are put back after."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from library.errors import ConfigError, ModelError
from library.models.families import sampling_weights as sw
from library.models.families.name_table import CHECKPOINT_PREFIX, NameTable
from library.networks.lora import LoraSpec, apply_lora

TABLE = NameTable(
    top={"first": "img_in"},
    lists=(("blocks", "transformer_blocks", {"attn.wq": "attn.to_q", "mlp.up": "ff.up"}),),
    model="Tiny",
)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.Module()
        self.attn.to_q = torch.nn.Linear(4, 4)
        self.ff = torch.nn.Module()
        self.ff.up = torch.nn.Linear(4, 6)


class Tiny(torch.nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.img_in = torch.nn.Linear(3, 4)
        self.transformer_blocks = torch.nn.ModuleList([Block(), Block()])


def original_state(model: Tiny, prefix: str = "") -> dict[str, torch.Tensor]:
    """The model's weights in the table's original names, written out by hand."""
    out = {}
    for name, value in model.state_dict().items():
        name = name.replace("img_in", "first").replace("transformer_blocks", "blocks")
        name = name.replace("attn.to_q", "attn.wq").replace("ff.up", "mlp.up")
        out[prefix + name] = value.clone()
    return out


@pytest.mark.parametrize("layout", ["original", "comfyui", "diffusers"])
def test_other_weights_are_swapped_in_for_the_round_and_put_back(tmp_path, layout):
    own, other = Tiny(0), Tiny(1)
    state = {
        "original": lambda: original_state(other),
        "comfyui": lambda: original_state(other, CHECKPOINT_PREFIX),
        "diffusers": lambda: {k: v.clone() for k, v in other.state_dict().items()},
    }[layout]()
    path = tmp_path / "other.safetensors"
    save_file(state, str(path))
    sw.check_same_weights("other_dit", str(path), "the other model", TABLE, own)
    apply_lora(own, {"transformer_blocks.0.attn.to_q": "linear"}, LoraSpec(2, 2.0))
    before = {k: v.clone() for k, v in own.state_dict().items()}
    x = torch.randn(2, 4)
    with sw.swapped_base_weights(own, sw.weights_files("other_dit", str(path), "x"), TABLE):
        swapped = own.state_dict()
        assert torch.equal(swapped["img_in.weight"], other.img_in.weight)
        assert torch.equal(
            swapped["transformer_blocks.0.attn.to_q.base_layer.weight"],
            other.transformer_blocks[0].attn.to_q.weight,
        )
        lora = {k for k in before if ".lora_" in k}
        assert lora and all(torch.equal(swapped[k], before[k]) for k in lora)  # adapters kept
        expected = own.transformer_blocks[1].ff.up(x)
        assert torch.equal(expected, other.transformer_blocks[1].ff.up(x))
    after = own.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())


def test_a_file_lacking_a_weight_or_of_another_size_is_refused_by_its_key(tmp_path):
    own = Tiny(0)
    state = original_state(Tiny(1))
    del state["blocks.1.mlp.up.bias"]
    path = tmp_path / "short.safetensors"
    save_file(state, str(path))
    with pytest.raises(ModelError, match=r"other_dit = .*transformer_blocks\.1\.ff\.up\.bias"):
        sw.check_same_weights("other_dit", str(path), "the other model", TABLE, own)
    with pytest.raises(ModelError, match="other_dit = .*: nothing there is the other model"):
        sw.weights_files("other_dit", str(tmp_path / "none"), "the other model")


def test_the_swap_is_refused_where_base_weights_are_not_stored_as_they_load(tmp_path):
    from tests.training.memory_helpers import write_config

    keys = {"pretrained_model_name_or_path": str(tmp_path), "blocks_to_swap": 2}
    config = write_config(tmp_path, keys)
    with pytest.raises(ConfigError, match="other_dit swaps .* blocks_to_swap .*remove other_dit"):
        sw.check_swap_options(config, "other_dit", "its weights", "samples use the model's own")
