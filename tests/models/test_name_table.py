"""The shared name table (library/models/families/name_table.py) builds both converters from one
table of stems: FLUX.1's table, declared as data over the shared dual- and single-stream
blocks, round-trips both ways, fused splits and the swapped adaLN halves included (its names are
checked against diffusers' single-file converter and by hand in tests/models/flux/
test_flux_keys.py and the conformance suite); and kohya's modules come from the same table."""

from __future__ import annotations

import pytest
import torch

from library.models.families.flux import original_keys as flux_keys
from library.models.families.name_table import (
    CHECKPOINT_PREFIX,
    NameTable,
    count_numbered,
)
from tests.kits.flux.tiny import build_tiny_flux_components

# FLUX.1's table (the shared stems with its modulation Linears, embedders and swapped halves);
# its names are checked by hand and against diffusers' converter in tests/models/flux.
FLUX_TABLE = flux_keys.TABLE


@pytest.fixture(scope="module")
def state():
    return build_tiny_flux_components("dev", 0)["transformer"].state_dict()


def _same(got: dict, want: dict) -> None:
    assert list(got) == list(want) or set(got) == set(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def test_both_directions_round_trip(state):
    original = FLUX_TABLE.to_original(state)
    _same(FLUX_TABLE.from_original(original), state)
    prefixed = {CHECKPOINT_PREFIX + k: v for k, v in original.items()}
    _same(FLUX_TABLE.from_original(prefixed), state)


def test_unknown_keys_and_missing_parts_are_refused(state):
    with pytest.raises(ValueError, match="not a key of a diffusers FluxTransformer2DModel"):
        FLUX_TABLE.to_original({"nowhere.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="not a key of an original FluxTransformer2DModel"):
        FLUX_TABLE.from_original({"double_blocks.0.nowhere.weight": torch.zeros(1)})
    partial = {k: v for k, v in state.items() if not k.endswith("attn.to_k.weight")}
    with pytest.raises(ValueError, match="some of its diffusers parts are missing"):
        FLUX_TABLE.to_original(partial)


def test_groups_linears_and_counts(state):
    assert FLUX_TABLE.block_groups == ("transformer_blocks.", "single_transformer_blocks.")
    assert FLUX_TABLE.original_group("model.diffusion_model.double_blocks.1.img_attn.qkv.weight",
                                     CHECKPOINT_PREFIX) == "model.diffusion_model.double_blocks.1."  # fmt: skip
    assert FLUX_TABLE.original_group("img_in.weight") == ""
    linears = dict(FLUX_TABLE.linears("single_blocks"))
    assert linears == {
        "linear1": ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"),
        "linear2": ("proj_out",),
        "modulation.lin": ("norm.linear",),
    }
    assert count_numbered(state, "single_transformer_blocks") == 2
    assert count_numbered(state, "no_such_blocks") == 0


def test_whole_stems_and_flat_rows():
    """A modulation table named like a Linear is one key (``whole``), and one stored flat in the
    original comes back with the diffusers tensor's rows (``rows``), both ways."""
    table = NameTable(
        top={"last.mod.lin": "norm_out.table"},
        lists=(("blocks", "transformer_blocks", {"mod.lin": "table", "wq": "attn.to_q"}),),
        model="Toy",
        whole=("mod.lin", "last.mod.lin"),
        rows={"mod.lin": 6},
    )
    table6, last, q = torch.randn(6, 4), torch.randn(2, 4), torch.randn(4, 4)
    state = {"transformer_blocks.0.table": table6, "norm_out.table": last,
             "transformer_blocks.0.attn.to_q.weight": q}  # fmt: skip
    original = table.to_original(state)
    want = {"blocks.0.mod.lin": table6.flatten(), "last.mod.lin": last, "blocks.0.wq.weight": q}
    _same(original, want)
    _same(table.from_original(original), state)
    assert table.linears("blocks") == (("wq", ("attn.to_q",)),)


def test_kohya_modules_of_every_list_and_the_top_level_come_from_the_table():
    """Every list's modules by default, and the top-level Linears the model has, are FLUX.1's
    hand-written kohya modules (an independent list): its blocks' (in the table's order), and
    its input embedders
    (guidance_in only where the model has it) beside the final layer's, whose adaLN halves the
    table swaps."""
    from library.models.families.flux.lora_keys import transformer_modules
    from library.networks.table_modules import table_modules, top_modules

    for variant in ("dev", "schnell"):
        model = build_tiny_flux_components(variant, 0)["transformer"]
        blocks = table_modules(model, "lora_unet", FLUX_TABLE)
        by_name = {m.name: m for m in transformer_modules(model)}
        assert {m.name: m for m in blocks} == by_name and len(blocks) == len(by_name)
        top = {m.original: m for m in top_modules(model, "lora_unet", FLUX_TABLE)}
        embedders = [m for m in transformer_modules(model, embedders=True) if m not in blocks]
        assert {m.original for m in embedders} | {"final_layer.linear",
                "final_layer.adaLN_modulation.1"} == set(top)  # fmt: skip
        assert all(top[m.original] == m for m in embedders)
        assert top["final_layer.adaLN_modulation.1"].swapped_halves
        assert ("guidance_in.in_layer" in top) == (variant == "dev")


def test_halves_swapped_only_in_an_entry_that_ends_early():
    """``swapped_without``: an entry's modulation is swapped only where the entry lacks the
    given key (a stream without its MLP), both ways; a full entry's stays as it is."""
    table = NameTable(
        top={},
        lists=(("blocks", "transformer_blocks", {"mod": "norm.linear", "mlp": "ff"}),),
        model="Toy",
        swapped_without={"mod": "mlp.weight"},
    )
    full, short, mlp = torch.randn(4, 2), torch.randn(4, 2), torch.randn(2, 2)
    original = {"blocks.0.mod.weight": full, "blocks.0.mlp.weight": mlp,
                "blocks.1.mod.weight": short}  # fmt: skip
    halves = short.chunk(2)
    want = {"transformer_blocks.0.norm.linear.weight": full, "transformer_blocks.0.ff.weight": mlp,
            "transformer_blocks.1.norm.linear.weight": torch.cat([halves[1], halves[0]])}  # fmt: skip
    _same(table.from_original(original), want)
    _same(table.to_original(want), original)
