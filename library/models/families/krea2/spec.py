"""Krea 2's facts as data: its pipeline and parts, its text taps, its schedule, and the names of
its transformer's weights in the original (Krea's and ComfyUI's) layout.

Sources (diffusers 0.42.1: pipelines/krea2/pipeline_krea2.py, models/transformers/
transformer_krea2.py, loaders/single_file_utils.convert_krea2_transformer_checkpoint_to_diffusers,
loaders/lora_conversion_utils._convert_non_diffusers_krea2_lora_to_diffusers; musubi-tuner's
docs/krea2.md):

- ``Krea2Pipeline``: transformer (``Krea2Transformer2DModel``, single-stream, 28 blocks of width
  48 x 128), vae (``AutoencoderKLQwenImage``, Qwen-Image's), text_encoder (``Qwen3VLModel``,
  Qwen3-VL-4B-Instruct), tokenizer, scheduler (``FlowMatchEulerDiscreteScheduler``);
  ``model_index.json`` also holds the pipeline's ``text_encoder_select_layers`` and
  ``is_distilled`` (the Turbo checkpoint's fixed shift mu = 1.15 and no guidance).
- Text: Qwen-Image's prompt template, padded before its 5 closing tokens, the first 34 tokens
  dropped; hidden states 2, 5, ..., 35 of Qwen3-VL stacked per token (twelve taps).
- Schedule: Euler over sigma with the exponential dynamic shift, mu linear in the image's token
  count from 0.5 at 256 tokens to 1.15 at 6400 (RAW); Turbo fixes mu = 1.15.
- Original names: ``blocks.<i>.attn.wq`` ... as Krea's raw.safetensors / turbo.safetensors and
  ComfyUI name them, each diffusers Linear one original Linear (no fused layer).
"""

from __future__ import annotations

from library.models.text_encoders.qwen3_vl import TappedQwen3VL

PIPELINE = "Krea2Pipeline"
TRANSFORMER_CLASS = "Krea2Transformer2DModel"
TAPS = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)  # the pipeline's default select layers
MAX_TOKENS = 512  # the pipeline's max_sequence_length
TURBO_MU = 1.15  # the distilled checkpoint's fixed shift
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
    """The released scheduler/: FlowMatchEulerDiscreteScheduler with Krea 2's dynamic shift."""
    return {
        "num_train_timesteps": 1000,
        "shift": 1.0,
        "use_dynamic_shifting": True,
        "base_shift": 0.5,
        "max_shift": 1.15,
        "base_image_seq_len": 256,
        "max_image_seq_len": 6400,
        "time_shift_type": "exponential",
    }


# --- original <-> diffusers names --------------------------------------------------------------

# (diffusers start, original start) of the transformer's top-level parts, tried in order
_HEADS = (
    ("img_in.", "first."),
    ("time_embed.linear_1.", "tmlp.0."),
    ("time_embed.linear_2.", "tmlp.2."),
    ("time_mod_proj.", "tproj.1."),
    ("txt_in.norm.weight", "txtmlp.0.scale"),
    ("txt_in.linear_1.", "txtmlp.1."),
    ("txt_in.linear_2.", "txtmlp.3."),
    ("text_fusion.", "txtfusion."),
    ("transformer_blocks.", "blocks."),
    ("final_layer.linear.", "last.linear."),
    ("final_layer.norm.weight", "last.norm.scale"),
    ("final_layer.scale_shift_table", "last.modulation.lin"),
)
# (diffusers part, original part) inside a block (the main blocks' and the text fusion's)
_INNER = (
    (".attn.to_q.", ".attn.wq."),
    (".attn.to_k.", ".attn.wk."),
    (".attn.to_v.", ".attn.wv."),
    (".attn.to_out.0.", ".attn.wo."),
    (".attn.to_gate.", ".attn.gate."),
    (".attn.norm_q.weight", ".attn.qknorm.qnorm.scale"),
    (".attn.norm_k.weight", ".attn.qknorm.knorm.scale"),
    (".ff.", ".mlp."),
    (".norm1.weight", ".prenorm.scale"),
    (".norm2.weight", ".postnorm.scale"),
    (".scale_shift_table", ".mod.lin"),
)
ORIGINAL_PREFIX = "model.diffusion_model."  # ComfyUI's checkpoints (Krea's files have none)


def to_original(name: str) -> str:
    """The original name of a diffusers weight (or, with a trailing dot, module path)."""
    for ours, theirs in _HEADS:
        if name.startswith(ours):
            name = theirs + name[len(ours) :]
            break
    for ours, theirs in _INNER:
        name = name.replace(ours, theirs)
    return name


def to_diffusers(name: str) -> str:
    """The diffusers name of an original weight or module path (``model.diffusion_model.``
    prefix allowed)."""
    name = name.removeprefix(ORIGINAL_PREFIX)
    for ours, theirs in _HEADS:
        if name.startswith(theirs):
            name = ours + name[len(theirs) :]
            break
    for ours, theirs in _INNER:
        name = name.replace(theirs, ours)
    return name


def linear_original(path: str) -> str:
    """The original module path of a diffusers Linear path."""
    return to_original(path + ".")[:-1]


def state_to_original(state, config=None) -> dict:
    """A transformer state dict in the original names (each block's modulation table flat)."""
    out = {}
    for key, value in state.items():
        name = to_original(key)
        if name.startswith("blocks.") and name.endswith(".mod.lin"):
            value = value.reshape(-1)
        out[name] = value
    return out


def state_from_original(state, config=None) -> dict:
    """An original-layout transformer state dict in diffusers' names."""
    out = {}
    for key, value in state.items():
        name = to_diffusers(key)
        if name.startswith("transformer_blocks.") and name.endswith(".scale_shift_table"):
            value = value.reshape(6, -1)
        out[name] = value
    return out
