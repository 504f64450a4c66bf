"""Load a single-file (original Stability layout) SD 1.x / 2.x / SDXL checkpoint, offline.

The family comes from the keys (CLIP-L text encoder: SD 1.x; OpenCLIP ViT-H: SD 2.x; two
``conditioner.embedders``: SDXL). What the keys cannot tell, the prediction target (SD 2.x 512
epsilon vs 768-v), comes from ``v_parameterization``, else from the file's
``modelspec.prediction_type`` metadata (kohya and difftune write it), else epsilon with a note.
Component configs: see library/models/checkpoint_parts.py. Tokenizers:
library/models/tokenizers.py. Pickled files are read weights-only (checkpoint_file.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from library.config.model_schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_file import PICKLE_SUFFIXES, CheckpointFile
from library.models.checkpoint_parts import plan_components, read_config
from library.models.components import Components
from library.models.families.base import ModelFamily, PredictionType
from library.models.families.sd import family as families
from library.models.families.sd.checkpoint_layout import FileLayout, detect_layout
from library.models.families.sd.family import family_for
from library.models.families.sd.objective import ddpm_objective
from library.models.model_files import offline
from library.models.plans import load_plan
from library.models.tokenizers import encoder_label, load_tokenizer_for

log = logging.getLogger(__name__)

SINGLE_FILE_SUFFIXES = (".safetensors", *PICKLE_SUFFIXES)


def is_single_file(path_text: str) -> bool:
    """True when ``pretrained_model_name_or_path`` names a weights file (not a folder)."""
    path = Path(path_text).expanduser()
    return path.suffix.lower() in SINGLE_FILE_SUFFIXES and not path.is_dir()


def sdxl_family(prediction: PredictionType = "epsilon") -> ModelFamily:
    """The SDXL family with this prediction target."""
    sdxl_for = getattr(families, "sdxl_for", None)
    if sdxl_for is None:
        raise ModelError("SDXL models are not supported by this version of difftune")
    return sdxl_for(prediction)


def file_family(
    model: ModelSection, layout: FileLayout, metadata: dict[str, str], path: Path
) -> ModelFamily:
    """The family of a checkpoint: architecture from its keys, prediction from the config."""
    prediction = _prediction(model, layout, metadata, path)
    if layout.name == "sdxl":
        return sdxl_family(prediction)
    v2 = layout.name == "sd2"
    if model.v2 is not None and model.v2 != v2:
        log.warning(
            "v2 = %s, but %s holds an SD %s model (by its text encoder); using SD %s",
            str(model.v2).lower(),
            path.name,
            "2.x" if v2 else "1.x",
            "2.x" if v2 else "1.x",
        )
    return family_for(v2, prediction)


def _prediction(
    model: ModelSection, layout: FileLayout, metadata: dict[str, str], path: Path
) -> PredictionType:
    if model.v_parameterization is not None:
        return "v_prediction" if model.v_parameterization else "epsilon"
    stored = metadata.get("modelspec.prediction_type")
    if stored in ("v", "v_prediction", "epsilon"):
        return "epsilon" if stored == "epsilon" else "v_prediction"
    if layout.name == "sd2":
        log.warning(
            "%s is an SD 2.x checkpoint and its keys do not say whether it predicts epsilon "
            "(512 base) or v (768-v); training with epsilon. Set v_parameterization = true for "
            "a 768-v model",
            path.name,
        )
    return "epsilon"


def load_single_file(model: ModelSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype):
    """Components of a single-file checkpoint; ModelError for any problem with the file.

    Tokenizers are found before any weight is read, so a missing one fails in a second.
    """
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist; nothing is downloaded")
    file = CheckpointFile(path)
    layout = detect_layout(file.keys(), path)
    family = file_family(model, layout, file.metadata, path)
    config_dir = layout.config_dir(family.v_parameterization)
    with offline():
        plans = plan_components(file, layout.towers, config_dir)
        channels = plans[0].config.get("in_channels", 4)
        if channels != 4:
            raise ModelError(
                f"{path}: the UNet takes {channels} input channels (an inpainting or depth "
                "model?); only text-to-image SD UNets (4 latent channels) can be trained"
            )
        tokenizers = [
            load_tokenizer_for(
                tower.kind,
                i,
                path,
                model.tokenizer_path,
                model.tokenizer_cache_dir,
                plan.config,
                encoder_label(tower.subfolder, len(layout.towers)),
            )
            for i, (tower, plan) in enumerate(zip(layout.towers, plans[2:], strict=True))
        ]
        modules = [
            load_plan(plan, vae_dtype if plan.part == "vae" else weight_dtype) for plan in plans
        ]
    scheduler_config = read_config(config_dir, "scheduler")
    encoders = modules[2:]
    return Components(
        denoiser=modules[0],
        vae=modules[1],
        text_encoders=tuple(encoders),
        tokenizers=tuple(tokenizers),
        objective=ddpm_objective(scheduler_config, family, model.zero_terminal_snr),
        family=family,
        model_dir=path,
    )
