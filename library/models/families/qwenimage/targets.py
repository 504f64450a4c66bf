"""Which Linears of a Qwen-Image transformer a LoRA adapts by default.

musubi-tuner's set (``networks.lora_qwen_image``): every Linear of the dual-stream blocks
(``transformer_blocks.<i>``, class ``QwenImageTransformerBlock``) except their timestep
modulation (``img_mod`` / ``txt_mod``), i.e. per block the image stream's ``attn.to_q``,
``to_k``, ``to_v``, ``to_out.0``, the caption stream's ``attn.add_q_proj``, ``add_k_proj``,
``add_v_proj``, ``to_add_out``, and both streams' feed-forward ``img_mlp.net.0.proj``,
``img_mlp.net.2``, ``txt_mlp.net.0.proj``, ``txt_mlp.net.2``. The last block's caption stream
after the joint attention (``attn.to_add_out``, ``txt_mlp``) is left out: the model's output is
the image stream's, so those Linears get no gradient (and would stall a DDP run, whose reducer
waits for every trained parameter). That is 12 x 60 - 3 = 717 Linears in the released model.
The blocks are found by class, so the rule holds at any layer count.
"""

from __future__ import annotations

from torch import nn

from library.networks.fused_keys import class_block_linears
from library.networks.targets import TargetKind

BLOCK_CLASS = "QwenImageTransformerBlock"
MODULATION = ("img_mod.", "txt_mod.")  # timestep -> scale/shift/gate Linears
# The caption stream's Linears after the joint attention: in the last block their output is
# dropped (the transformer's output is the image stream's).
CAPTION_TAIL = ("attn.to_add_out", "txt_mlp.")


def default_targets(transformer: nn.Module, *, modulation: bool = False) -> dict[str, TargetKind]:
    """Map module path -> "linear" for the Linears a default Qwen-Image LoRA adapts, sorted
    (not the last block's caption tail); ``modulation`` adds each block's img_mod / txt_mod
    Linears. Works on the meta device and on a model already given adapters."""
    blocks = class_block_linears(transformer, BLOCK_CLASS)
    last = next(reversed(blocks), None)
    targets: dict[str, TargetKind] = {
        f"{block}.{sub}": "linear"
        for block, subs in blocks.items()
        for sub in subs
        if (modulation or not sub.startswith(MODULATION))
        and not (block == last and sub.startswith(CAPTION_TAIL))  # never reaches the output
    }
    if not targets:
        raise ValueError(f"no {BLOCK_CLASS} blocks found in {type(transformer).__name__}")
    return dict(sorted(targets.items()))
