"""class_block_linears: the blocks of one class, found by name at any depth, each with the
Linears inside it, through a DDP-style wrapper."""

from __future__ import annotations

from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.ModuleDict({"to_q": nn.Linear(2, 2), "norm": nn.LayerNorm(2)})
        self.mlp = nn.Sequential(nn.Linear(2, 4), nn.GELU(), nn.Linear(4, 2))


class Wrapper(nn.Module):
    def __init__(self, module):
        super().__init__()
        self._orig_mod = module  # what torch.compile wraps


def test_blocks_of_the_class_with_their_linears():
    from library.networks.fused_keys import class_block_linears

    model = nn.ModuleDict(
        {"blocks": nn.ModuleList([Block(), Block()]), "head": nn.Linear(2, 2),
         "deep": nn.Sequential(Block())}
    )  # fmt: skip
    expected = {
        path: [p for p, m in module.named_modules() if isinstance(m, nn.Linear)]
        for path, module in model.named_modules()
        if isinstance(module, Block)
    }
    assert list(expected) == ["blocks.0", "blocks.1", "deep.0"]
    assert class_block_linears(model, "Block") == expected
    assert class_block_linears(Wrapper(model), "Block") == expected
    assert class_block_linears(model, "Other") == {}
