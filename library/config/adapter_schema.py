"""The [adapter] section: the adapter options kohya users give in network_args.

Two groups, each meaningful for one network_module only (the other refuses them by name, see
:func:`adapter_problem`):
- LyCORIS' options (``network_module = "lycoris.kohya"``): the algorithm (LoCon, LoHa, LoKr),
  its factorisation and decomposition switches, DoRA, and which layers the preset adapts;
- kohya's block-wise options of ``networks.lora``: per-block ranks, alphas and learning-rate
  weights of an SD/SDXL UNet.

Every key is unset by default, and may be written either in network_args (``"algo=loha"``) or
as a plain key (``algo = "loha"``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from library.config.section import Section
from library.networks.lycoris.spec import LycorisSpec

LYCORIS_MODULE = "lycoris.kohya"
# The largest adapter rank: above every layer's smaller side in the models difftune trains (a
# rank beyond it adds nothing), and a bound before adapters are allocated (2e9 would be 256 GB).
MAX_RANK = 8192
Algo = Literal["lora", "locon", "loha", "lokr"]
# LyCORIS' built-in presets that adapt layer sets difftune reproduces (library/networks/lycoris
# /targets.py); a preset file or another name is refused.
Preset = Literal[
    "full",
    "full-lin",
    "attn-mlp",
    "attn-only",
    "unet-only",
    "unet-transformer-only",
    "unet-convblock-only",
]
LrWeight = str | float | list[float]


class AdapterSection(Section):
    """LyCORIS options and networks.lora's block-wise options (kohya's network_args)."""

    algo: Algo | None = Field(
        None,
        description='LyCORIS algorithm (network_module = "lycoris.kohya"): "lora" or "locon" '
        '(low-rank, the same algorithm), "loha" (Hadamard product of two low-rank pairs) or '
        '"lokr" (Kronecker product). Unset: "lora".',
    )
    preset: Preset | None = Field(
        None,
        description='LyCORIS preset: which layers are adapted. "full" (default): attention, '
        "MLP and ResNet layers, plus conv_in/conv_out and the time embedding on SD 1.x/2.x; "
        '"full-lin": the same without 3x3 convs; "attn-mlp": transformer blocks only; '
        '"attn-only": attention layers only; "unet-only": "full" without text encoders; '
        '"unet-transformer-only": "attn-mlp" without text encoders; "unet-convblock-only": '
        "the UNet's ResNet blocks and samplers only.",
    )
    factor: int | None = Field(
        None,
        description="LoKr: the size of the first Kronecker factor; -1 (default) takes the most "
        "balanced split of each dimension.",
    )
    decompose_both: bool | None = Field(
        None,
        description="LoKr: factor the first Kronecker matrix into two low-rank matrices too. "
        "Unset: false.",
    )
    use_tucker: bool | None = Field(
        None,
        description="LyCORIS: give kxk conv adapters a Tucker core (an extra rank x rank x k x k "
        "tensor) instead of folding the kernel into one factor. LyCORIS' older names use_cp "
        "and use_conv_cp are read too. Unset: false.",
    )
    use_scalar: bool | None = Field(
        None,
        description="LyCORIS: a trained scalar multiplies the adapter, and both factors start "
        "non-zero. Unset: false.",
    )
    full_matrix: bool | None = Field(
        None,
        description="LoKr: keep the second Kronecker matrix full instead of low-rank. Unset: false.",
    )
    unbalanced_factorization: bool | None = Field(
        None,
        description="LoKr: swap the factors of each dimension (the larger one first). "
        "Unset: false.",
    )
    dora_wd: bool | None = Field(
        None,
        description="DoRA (weight-decomposed adaptation): train a magnitude per output (or input) "
        "channel and let the adapter change only the weight's direction. Unset: false.",
    )
    wd_on_output: bool | None = Field(
        None,
        description="DoRA: the magnitude is one number per output channel (true, LyCORIS' "
        "default) or per input channel (false).",
    )
    rs_lora: bool | None = Field(
        None,
        description="LyCORIS: rank-stabilised scale alpha / sqrt(rank) instead of alpha / rank. "
        "Unset: false.",
    )
    down_lr_weight: LrWeight | None = Field(
        None,
        description="networks.lora: learning-rate multipliers of the UNet's down (input) blocks: "
        '12 numbers (SDXL: 9), one number for all, or a curve "sine", "cosine", "linear", '
        '"reverse_linear", "zeros" (optionally "+0.5" added). Unset: 1.',
    )
    mid_lr_weight: float | list[float] | None = Field(
        None,
        description="networks.lora: learning-rate multiplier of the middle block (SDXL: 3 "
        "numbers, or one for the first of them). Unset: 1.",
    )
    up_lr_weight: LrWeight | None = Field(
        None,
        description="networks.lora: learning-rate multipliers of the UNet's up (output) blocks, "
        "as down_lr_weight. Unset: 1.",
    )
    block_lr_zero_threshold: float | None = Field(
        None,
        description="networks.lora: blocks whose learning-rate weight is at or below this get "
        "no adapter at all. Unset: 0.",
    )
    block_dims: list[Annotated[int, Field(le=MAX_RANK)]] | None = Field(
        None,
        description="networks.lora: the rank of each of the UNet's blocks in kohya's numbering: "
        "25 for SD 1.x/2.x (12 down, the middle, 12 up), 23 for SDXL (the embeddings, 9 input, "
        "3 middle, 9 output, the output head). Unset: network_dim everywhere.",
    )
    block_alphas: list[float] | None = Field(
        None,
        description="networks.lora: the alpha of each block, with block_dims. Unset: "
        "network_alpha everywhere.",
    )
    conv_block_dims: list[Annotated[int, Field(le=MAX_RANK)]] | None = Field(
        None,
        description="networks.lora: the conv (LoCon) rank of each block; 0 leaves a block's "
        "3x3 convs alone. Unset: conv_dim everywhere.",
    )
    conv_block_alphas: list[float] | None = Field(
        None,
        description="networks.lora: the conv alpha of each block, with conv_block_dims. Unset: "
        "conv_alpha everywhere.",
    )


LYCORIS_KEYS = (
    "algo",
    "preset",
    "factor",
    "decompose_both",
    "use_tucker",
    "use_scalar",
    "full_matrix",
    "unbalanced_factorization",
    "dora_wd",
    "wd_on_output",
    "rs_lora",
)
BLOCKWISE_KEYS = (
    "down_lr_weight",
    "mid_lr_weight",
    "up_lr_weight",
    "block_lr_zero_threshold",
    "block_dims",
    "block_alphas",
    "conv_block_dims",
    "conv_block_alphas",
)


def adapter_problem(adapter: AdapterSection, network_module: str) -> str | None:
    """The first set key that ``network_module`` has no use for, as a one-line problem with
    its fix; None when every set key applies."""
    lycoris = network_module == LYCORIS_MODULE
    for key in LYCORIS_KEYS if not lycoris else BLOCKWISE_KEYS:
        if getattr(adapter, key) is None:
            continue
        if lycoris:
            return (
                f"{key} is a block-wise option of networks.lora, which LyCORIS does not read; "
                f'remove it or use network_module = "networks.lora"'
            )
        return f'{key} is a LyCORIS option; set network_module = "{LYCORIS_MODULE}" or remove it'
    return None


def lycoris_spec(config) -> LycorisSpec:
    """The LyCORIS spec a config (its ``network`` and ``adapter`` sections) asks for;
    ValueError naming the network_args item LyCORIS would refuse. The config check calls it, so
    such a value stops at config load, before any model is read."""
    net, adapter = config.network, config.adapter
    options = {k: v for k, v in adapter.model_dump().items() if v is not None and k != "preset"}
    return LycorisSpec.from_config(
        options, net.network_dim, net.network_alpha, net.conv_dim, net.conv_alpha
    )
