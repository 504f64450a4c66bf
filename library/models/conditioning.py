"""What the UNet is conditioned on, for every family, from the family's data.

SD 1.x/2.x: the hidden states of the one text encoder (cross-attention), nothing else.
SDXL: both encoders' penultimate hidden states concatenated along the channels, plus the
pooled, projected embedding of the last encoder and the six size numbers (original height and
width, crop top and left, target height and width) through the UNet's ``added_cond_kwargs``.
These are the facts of diffusers' StableDiffusionXLPipeline.encode_prompt and _get_add_time_ids,
and of SDXL's training.

The caption-dependent part (``encode_text`` -> ``TextConditioning``) is separate from the
per-sample sizes (``assemble_conditioning``), so frozen encoders' outputs can be cached per
caption (library.training.text_cache); ``encode_conditioning`` does both.

Nothing here switches gradients off: a frozen encoder builds no graph (its inputs are token ids),
one with a trained adapter keeps its gradients; wrap the call in torch.no_grad() when no encoder
trains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from library.models.conditioning_data import Conditioning, TextConditioning
from library.models.families.base import REFERENCE_PIXELS_KEY, ModelFamily
from library.models.text import encode_token_ids, flatten_windows, join_windows, tokenize
from library.networks.adapters import freeze_adapters

# Batch keys of the size conditioning (library/data/dataset.py), in SDXL's time-ids order.
SIZE_KEYS = ("original_sizes", "crop_top_lefts", "target_sizes")


def size_time_ids(batch: Mapping, device: torch.device | str) -> torch.Tensor:
    """SDXL's time ids [B, 6] = (original h, w, crop top, left, target h, w) per sample.

    ``batch`` holds ``original_sizes``, ``crop_top_lefts`` and ``target_sizes``, each [B, 2].
    """
    missing = [key for key in SIZE_KEYS if key not in batch]
    if missing:
        raise KeyError(f"the batch lacks {', '.join(missing)}, needed for size conditioning")
    parts = [torch.as_tensor(batch[key]).reshape(-1, 2) for key in SIZE_KEYS]
    return torch.cat(parts, dim=1).to(device=device, dtype=torch.float32)


def plain_sizes(batch_size: int, height: int, width: int) -> dict[str, torch.Tensor]:
    """Size-conditioning batch entries for images generated at (height, width): original size
    = target size, no crop (what samplers pass)."""
    size = torch.tensor([[height, width]] * batch_size, dtype=torch.long)
    return {
        "original_sizes": size,
        "crop_top_lefts": torch.zeros_like(size),
        "target_sizes": size.clone(),
    }


def _hidden_and_pooled(
    family: ModelFamily,
    text_encoder: torch.nn.Module,
    input_ids: torch.Tensor,
    clip_skip: int | None,
    pooled: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One encoder's conditioning hidden states, and its pooled projection when asked.

    ``input_ids`` is [B, 77] or long-prompt windows [B, n, 77] (library.models.text): the layer
    is taken per window and the windows joined; the pooled embedding is window 0's, the state
    at its first EOS through the projection, as kohya's SDXL encoding takes it.
    """
    if family.text_layer == "last" and not pooled:
        return encode_token_ids(text_encoder, input_ids, clip_skip), None
    # clip_skip does not apply to a family that conditions on fixed layers (SDXL): sd-scripts
    # ignores it there, and the family's option check says so once at start
    flat, windows = flatten_windows(input_ids)
    out = text_encoder(flat, output_hidden_states=True, return_dict=True)
    # The penultimate layer is taken without the final layer norm, as SDXL was trained.
    penultimate = family.text_layer == "penultimate"
    hidden = join_windows(out.hidden_states[-2] if penultimate else out.last_hidden_state, windows)
    if not pooled:
        return hidden, None
    if getattr(out, "text_embeds", None) is None:
        raise ValueError(
            f"{type(text_encoder).__name__} gives no projected pooled embedding; {family.name} "
            "needs a CLIPTextModelWithProjection as its last text encoder"
        )
    return hidden, out.text_embeds[::windows]


def unused_text_layers(
    family: ModelFamily, index: int, num_layers: int, clip_skip: int | None = None
) -> range:
    """Indices of text encoder ``index``'s layers whose output never reaches the conditioning
    (the family's rule, e.g. SDXL's penultimate layer or clip_skip). Their adapters get no
    gradient."""
    return family.unused_text_layers(index, num_layers, clip_skip)


def freeze_unused_text_adapters(
    family: ModelFamily, encoders: Sequence[torch.nn.Module], clip_skip: int | None = None
) -> list[str]:
    """Stop training the adapters of unused text-encoder layers (``unused_text_layers``).

    They would never get a gradient, which DistributedDataParallel refuses (it waits for every
    parameter that requires grad). They stay in the model, so saved files keep every module,
    as kohya's do (with their up weights still zero). Returns the frozen adapter paths.
    """
    frozen = []
    for index, encoder in enumerate(encoders):
        layers = encoder.config.num_hidden_layers
        unused = unused_text_layers(family, index, layers, clip_skip)
        marks = tuple(f"encoder.layers.{i}." for i in unused)
        if marks:
            frozen += freeze_adapters(encoder, lambda path, m=marks: any(x in f"{path}." for x in m))
    return frozen


def encode_text(
    family: ModelFamily,
    tokenizers: Sequence[object],
    text_encoders: Sequence[torch.nn.Module],
    captions: Sequence[str],
    device: torch.device | str,
    clip_skip: int | None = None,
    max_token_length: int | None = None,
) -> TextConditioning:
    """The text part of ``family``'s conditioning of ``captions`` (the family's encode_text);
    ``tokenizers``/``text_encoders`` in ``family.text_encoder_subfolders`` order."""
    return family.encode_text(
        tokenizers, text_encoders, captions, device, clip_skip, max_token_length
    )


def assemble_conditioning(
    family: ModelFamily,
    text: TextConditioning,
    batch: Mapping | None,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
) -> Conditioning:
    """The denoiser's conditioning from the text part and the batch (the family's own)."""
    return family.assemble_conditioning(text, batch, device, dtype)


def clip_text_conditioning(
    family: ModelFamily,
    tokenizers: Sequence[object],
    text_encoders: Sequence[torch.nn.Module],
    captions: Sequence[str],
    device: torch.device | str,
    clip_skip: int | None = None,
    max_token_length: int | None = None,
) -> TextConditioning:
    """The text part of ``family``'s conditioning of ``captions``, in the encoders' dtype.

    ``tokenizers``/``text_encoders`` are in ``family.text_encoder_subfolders`` order (e.g.
    ``components.tokenizers`` and the possibly DDP-wrapped encoders). Each encoder's hidden
    states come from ``family.text_layer``; several encoders are concatenated along channels.
    With ``family.uses_pooled_text_embedding`` the last encoder's projected pooled embedding is
    ``pooled``. ``clip_skip``: see library.models.text.encode_token_ids ("last" layer only);
    ``max_token_length`` (None, 75, 150, 225): long prompts, see library.models.text.
    """
    expected = len(family.text_encoder_subfolders)
    if len(tokenizers) != expected or len(text_encoders) != expected:
        raise ValueError(
            f"{family.name} has {expected} text encoders, got {len(text_encoders)} encoders and "
            f"{len(tokenizers)} tokenizers"
        )
    hidden_parts, pooled = [], None
    last = expected - 1
    for index, (tokenizer, encoder) in enumerate(zip(tokenizers, text_encoders, strict=True)):
        input_ids = tokenize(tokenizer, list(captions), max_token_length).to(device)
        want_pooled = family.uses_pooled_text_embedding and index == last
        hidden, pooled_here = _hidden_and_pooled(family, encoder, input_ids, clip_skip, want_pooled)
        hidden_parts.append(hidden)
        pooled = pooled_here if pooled_here is not None else pooled
    hidden = hidden_parts[0] if len(hidden_parts) == 1 else torch.cat(hidden_parts, dim=-1)
    return TextConditioning(hidden, pooled)


def unet_conditioning(
    family: ModelFamily,
    text: TextConditioning,
    batch: Mapping | None,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
) -> Conditioning:
    """SD's UNet conditioning from the text part and the per-sample sizes, on ``device``.

    With ``family.uses_size_conditioning`` ``batch`` must hold the size keys (see
    ``size_time_ids``; ``plain_sizes`` makes them). ``dtype`` casts the result for the UNet.
    """
    added = {}
    if text.pooled is not None:
        added["text_embeds"] = text.pooled.to(device)
    if family.uses_size_conditioning:
        added["time_ids"] = size_time_ids(batch or {}, device)
    cond = Conditioning(text.hidden.to(device), {"added_cond_kwargs": added} if added else {})
    return cond.to(dtype) if dtype is not None else cond


def encode_conditioning(
    family: ModelFamily,
    tokenizers: Sequence[object],
    text_encoders: Sequence[torch.nn.Module],
    captions: Sequence[str],
    device: torch.device | str,
    batch: Mapping | None = None,
    dtype: torch.dtype | None = None,
    clip_skip: int | None = None,
    max_token_length: int | None = None,
) -> Conditioning:
    """The UNet conditioning of ``captions`` for a model of ``family``:
    ``assemble_conditioning(encode_text(...))``; see those two for the arguments. A family whose
    text encoder reads the reference images reads them from ``batch``
    (``ModelFamily.encode_text_with_references``)."""
    if family.text_reads_references and batch is not None and REFERENCE_PIXELS_KEY in batch:
        text = family.encode_text_with_references(
            tokenizers, text_encoders, captions, batch[REFERENCE_PIXELS_KEY], device
        )
    else:
        text = encode_text(
            family, tokenizers, text_encoders, captions, device, clip_skip, max_token_length
        )
    return assemble_conditioning(family, text, batch, device, dtype)
