"""Loading SD 1.x/2.x/SDXL diffusers folders (single files: single_file.py beside this module).

The folder's parts, its family (library.models.families.sd.family.detect_family), its modules
frozen in the weight dtype, and the DDPM objective over the folder's noise schedule.
"""

from __future__ import annotations

from pathlib import Path

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_file import PICKLE_SUFFIXES
from library.models.components import Components
from library.models.families.claims import file_claimed, model_index
from library.models.families.sd.checkpoint_layout import DAMAGED_MARKS, detect_sd
from library.models.families.sd.family import detect_family
from library.models.families.sd.objective import ddpm_objective
from library.models.families.sd.single_file import is_single_file, load_single_file
from library.models.model_files import load_weights, offline, read_json, resolve_model_dir
from library.models.tokenizers import encoder_label, folder_tokenizer

# Subfolder -> the file that must be in it. CLIP tokenizers come as vocab.json + merges.txt,
# tokenizer.json, or both, so the tokenizer has its own check.
_REQUIRED = {
    "unet": "config.json",
    "vae": "config.json",
    "text_encoder": "config.json",
    "tokenizer": None,  # see _check_tokenizer_files
    "scheduler": "scheduler_config.json",
}
_SDXL_REQUIRED = {"text_encoder_2": "config.json", "tokenizer_2": None}


def required_parts(path_text: str, tokenizer_path: str | None = None) -> dict[str, str | None]:
    """The subfolders (and the file each needs) of an SD 1.x/2.x or SDXL diffusers folder;
    with ``tokenizer_path``, which replaces them, not its tokenizer folders."""
    index = Path(path_text).expanduser().absolute() / "model_index.json"
    needed = dict(_REQUIRED)
    if index.is_file() and "text_encoder_2" in read_json(index):
        needed.update(_SDXL_REQUIRED)
    if tokenizer_path:
        needed = {sub: file for sub, file in needed.items() if not sub.startswith("tokenizer")}
    return needed


# The parts model_index.json lists for every SD 1.x/2.x and SDXL pipeline (SDXL adds its second
# text encoder); other pipelines with a UNet (Kandinsky, DeepFloyd IF, AnimateDiff) differ here.
_FOLDER_PARTS = {"unet": "UNet2DConditionModel", "text_encoder": "CLIPTextModel"}


def claims_sd(model: ModelSection, flow: FlowSection) -> bool:
    """True for an SD 1.x/2.x/SDXL diffusers folder (by the parts its model_index.json lists),
    a pickled checkpoint (.ckpt, .pt, .pth, .bin: only this loader reads them, weights-only),
    or a .safetensors file holding an SD checkpoint's keys (damaged ones by their header text).
    Anything else is no family's: family_choice says what it is."""
    path = Path(model.pretrained_model_name_or_path).expanduser()
    if path.is_dir():
        index = model_index(path)
        return all(
            isinstance(index.get(sub), list) and cls in index[sub]
            for sub, cls in _FOLDER_PARTS.items()
        )
    if path.is_file() and path.suffix.lower() in PICKLE_SUFFIXES:
        return True
    return file_claimed(path, detect_sd, DAMAGED_MARKS)


def load_sd(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
):
    """Components of an SD 1.x/2.x/SDXL model: a single-file checkpoint or a diffusers folder
    (``flow`` is every family loader's argument; SD reads no [flow] key)."""
    if is_single_file(model.pretrained_model_name_or_path):
        return load_single_file(model, weight_dtype, vae_dtype)
    return load_sd_folder(model, weight_dtype, vae_dtype)


def load_sd_folder(model: ModelSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype):
    """Components of a local diffusers folder (SD 1.x/2.x, or SDXL with text_encoder_2)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    path = model.pretrained_model_name_or_path
    model_dir = resolve_model_dir(path, required_parts(path, model.tokenizer_path))
    unet_config = read_json(model_dir / "unet" / "config.json")
    scheduler_config = read_json(model_dir / "scheduler" / "scheduler_config.json")
    model_index = read_json(model_dir / "model_index.json")
    sdxl = _refuse_unsupported(model_dir, unet_config, model_index)
    family = detect_family(model, unet_config, scheduler_config, model_index)
    second = None
    with offline():
        # Tokenizers first, checked against their encoders' configs: a wrong one fails in a
        # second, not after the weights.
        tokenizers = sd_folder_tokenizers(model_dir, model.tokenizer_path, sdxl)
        unet = load_weights(UNet2DConditionModel, model_dir, "unet", weight_dtype)
        vae = load_weights(AutoencoderKL, model_dir, "vae", vae_dtype)
        text_encoder = load_weights(CLIPTextModel, model_dir, "text_encoder", weight_dtype)
        tokenizer = tokenizers[0]
        if sdxl:
            encoder_2 = load_weights(
                CLIPTextModelWithProjection, model_dir, "text_encoder_2", weight_dtype
            )
            second = (encoder_2, tokenizers[1])
    modules = (unet, vae, text_encoder, *(second[:1] if second else ()))
    for module in modules:
        module.requires_grad_(False)
        module.eval()
    return Components(
        denoiser=unet,
        vae=vae,
        text_encoders=(text_encoder, *second[:1]) if second else (text_encoder,),
        tokenizers=(tokenizer, *second[1:]) if second else (tokenizer,),
        objective=ddpm_objective(scheduler_config, family, model.zero_terminal_snr),
        family=family,
        model_dir=model_dir,
    )


def sd_folder_tokenizers(model_dir: Path, tokenizer_path: str | None, sdxl: bool) -> list:
    """The folder's CLIP tokenizers (tokenizer/, and SDXL's tokenizer_2/), or ``tokenizer_path``'s
    (as for a single file), each checked against its encoder's config."""
    subs = (("tokenizer", "text_encoder"), ("tokenizer_2", "text_encoder_2"))[: 2 if sdxl else 1]
    return [
        folder_tokenizer(
            model_dir, sub, "openclip" if index else "clip", index, tokenizer_path,
            read_json(model_dir / encoder / "config.json"), encoder_label(encoder, len(subs)),
        )  # fmt: skip
        for index, (sub, encoder) in enumerate(subs)
    ]


def _refuse_unsupported(model_dir: Path, unet_config: dict, index: dict) -> bool:
    """Fail early, before minutes of loading, for model kinds this trainer cannot train.

    Returns True for an SDXL folder (two text encoders, size conditioning).
    """
    sdxl = unet_config.get("addition_embed_type") == "text_time" or "text_encoder_2" in index
    if sdxl and "text_encoder_2" not in index:
        raise ModelError(
            f"{model_dir} has an SDXL UNet but no text_encoder_2 (an SDXL refiner?); only SDXL "
            "base models can be trained"
        )
    channels = unet_config.get("in_channels", 4)
    if channels != 4:
        raise ModelError(
            f"{model_dir / 'unet'} takes {channels} input channels (an inpainting or depth "
            "model?); only text-to-image SD UNets (4 latent channels) can be trained"
        )
    return sdxl
