"""Krea 2's facts as data (diffusers 0.42.1's Krea2Pipeline, Krea2Transformer2DModel and its
single-file and LoRA converters; musubi-tuner's docs/krea2.md): the pipeline's parts
(transformer, the Qwen-Image VAE, Qwen3VLModel, tokenizer, scheduler; model_index.json's
text_encoder_select_layers and is_distilled), its text template (Qwen-Image's, padded before
its 5 closing tokens, the first 34 dropped) and taps, its schedule (exponential shift, mu from
0.5 at 256 tokens to 1.15 at 6400; Turbo: mu = 1.15), and the transformer's original names
(Krea's raw.safetensors and ComfyUI's: each diffusers Linear one original Linear)."""

from __future__ import annotations

from library.models.text_encoders.qwen3_vl import TappedQwen3VL

PIPELINE = "Krea2Pipeline"
TRANSFORMER_CLASS = "Krea2Transformer2DModel"
TAPS = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)  # the pipeline's default select layers
MAX_TOKENS = 512  # the pipeline's max_sequence_length
PATCH = 2
PIXEL_MULTIPLE = 8 * PATCH  # the VAE's 8 times the 2x2 patches
PREFIX = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n"
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"


def detect_krea2(keys) -> str | None:
    """ "transformer" when the keys are a Krea 2 transformer's (its text fusion's projector, a
    name no other family has, original or diffusers'), else None."""
    for key in keys:
        if key.removeprefix(ORIGINAL_PREFIX).startswith(("txtfusion.proj", "text_fusion.proj")):
            return "transformer"
    return None


def taps_for(depth: int, count: int) -> tuple[int, ...]:
    """The taps of single files, which do not name them: ``count`` layers evenly spaced, the
    deepest the one before the last (the release's 2, 5, ..., 35 of Qwen3-VL-4B's 36)."""
    step = max(depth // count, 1)
    return tuple(depth - 1 - (count - 1 - i) * step for i in range(count))


def text_taps(layers=TAPS, max_tokens: int = MAX_TOKENS) -> TappedQwen3VL:
    """How Krea 2 reads Qwen3-VL (the pipeline's template, drop and taps)."""
    return TappedQwen3VL(PREFIX, SUFFIX, 34, 5, tuple(layers), max_tokens)


def scheduler_config() -> dict:
    """The released scheduler/ (FlowMatchEulerDiscreteScheduler, Krea 2's dynamic shift)."""
    return {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": True,
            "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
            "max_image_seq_len": 6400, "time_shift_type": "exponential"}  # fmt: skip


# (diffusers, original) starts of the transformer's top-level parts, the first that fits
_HEADS = (
    ("img_in.", "first."), ("time_embed.linear_1.", "tmlp.0."), ("time_embed.linear_2.", "tmlp.2."),
    ("time_mod_proj.", "tproj.1."), ("txt_in.norm.weight", "txtmlp.0.scale"),
    ("txt_in.linear_1.", "txtmlp.1."), ("txt_in.linear_2.", "txtmlp.3."),
    ("text_fusion.", "txtfusion."), ("transformer_blocks.", "blocks."),
    ("final_layer.linear.", "last.linear."), ("final_layer.norm.weight", "last.norm.scale"),
    ("final_layer.scale_shift_table", "last.modulation.lin"),
)  # fmt: skip
# (diffusers, original) parts inside the main blocks and the text fusion's, each replaced
_INNER = (
    (".attn.to_q.", ".attn.wq."), (".attn.to_k.", ".attn.wk."), (".attn.to_v.", ".attn.wv."),
    (".attn.to_out.0.", ".attn.wo."), (".attn.to_gate.", ".attn.gate."),
    (".attn.norm_q.weight", ".attn.qknorm.qnorm.scale"),
    (".attn.norm_k.weight", ".attn.qknorm.knorm.scale"), (".ff.", ".mlp."),
    (".norm1.weight", ".prenorm.scale"), (".norm2.weight", ".postnorm.scale"),
    (".scale_shift_table", ".mod.lin"),
)  # fmt: skip
ORIGINAL_PREFIX = "model.diffusion_model."  # ComfyUI's checkpoints (Krea's files have none)


def _renamed(name: str, back: bool) -> str:
    """A weight (or, with a trailing dot, module) name diffusers -> original, or ``back``."""
    a, b = (1, 0) if back else (0, 1)
    head = next((pair for pair in _HEADS if name.startswith(pair[a])), None)
    if head is not None:
        name = head[b] + name[len(head[a]) :]
    for pair in _INNER:
        name = name.replace(pair[a], pair[b])
    return name


def linear_original(path: str) -> str:
    """The original module path of a diffusers Linear path."""
    return _renamed(path + ".", False)[:-1]


def state_to_original(state, config=None) -> dict:
    """A transformer state dict in the original names (each block's modulation table flat)."""
    out = {_renamed(k, False): v for k, v in state.items()}
    return {k: v.reshape(-1) if k.endswith(".mod.lin") else v for k, v in out.items()}


def diffusers_name(key: str) -> str:
    """The diffusers name of an original weight name (ComfyUI's prefix allowed)."""
    return _renamed(key.removeprefix(ORIGINAL_PREFIX), True)


def state_from_original(state, config=None) -> dict:
    """An original-layout state dict (ComfyUI's prefix allowed) in diffusers' names."""
    out = {diffusers_name(k): v for k, v in state.items()}
    return {
        k: v.reshape(6, -1) if k.startswith("transformer_blocks.") and k.endswith("_table") else v
        for k, v in out.items()
    }
