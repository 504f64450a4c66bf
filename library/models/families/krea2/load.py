"""Reading Krea 2: a Krea2Pipeline folder through the shared folder loader ([flow]
text_encoder and [model] vae files replace its parts), or the single files (files.py). RAW or
Turbo: the folder's model_index.json is_distilled, or [flow] dit_variant for a file."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.claims import claims_model
from library.models.families.folder_loader import (
    CheckedFolder,
    FolderPart,
    FolderTokenizer,
    PipelineFolder,
    load_folder,
)
from library.models.families.krea2 import files, spec
from library.models.families.krea2.family import krea2_family
from library.models.families.krea2.objective import Krea2FlowObjective, krea2_flow_options
from library.models.families.krea2.turbo import check_turbo
from library.models.families.local_tokenizer import folder_or_path_tokenizer
from library.models.loader import Components, read_json
from library.models.patch_tokens import PATCH

log = logging.getLogger(__name__)
_MARK = re.compile(r'"(model\.diffusion_model\.)?(txtfusion|text_fusion)\.projector\.')


def claims_krea2(model: ModelSection, flow: FlowSection) -> bool:
    """True for a Krea2Pipeline folder, or a .safetensors file of a Krea 2 transformer."""
    return claims_model(model, spec.PIPELINE, spec.TRANSFORMER_CLASS, spec.detect_krea2, _MARK,
                        FOLDER.family)  # fmt: skip


@dataclass(frozen=True)
class FolderFacts:
    """The sampling scheduler, the pipeline's taps and whether the transformer is Turbo."""

    scheduler: dict
    taps: tuple[int, ...]
    distilled: bool


def warn_if_distilled(distilled: bool) -> None:
    """Training the distilled Turbo collapses its few-step sampling; Krea trains on RAW."""
    if distilled:
        log.warning(
            "Krea 2: the model is the distilled Turbo checkpoint; LoRAs are trained on Krea 2 "
            "RAW (krea/Krea-2-Raw) and applied to Turbo at inference. Training Turbo itself "
            "loses its 8-step sampling"
        )


def load_krea2(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Krea 2's Components (frozen, on the CPU); ModelError for any problem with the files."""
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if not path.is_dir():
        modules, tokenizer = files.load_krea2_files(path, model, flow, weight_dtype, vae_dtype)
        depth = modules["text_encoder"].config.text_config.num_hidden_layers
        taps = spec.taps_for(depth, modules["transformer"].config.num_text_layers)
        turbo = flow.dit_variant == "turbo"
        facts, model_dir = FolderFacts(spec.scheduler_config(), taps, turbo), path
    else:
        loaded = load_folder(FOLDER, path, model, flow, weight_dtype, vae_dtype)
        modules, (tokenizer,) = loaded.modules, loaded.tokenizers.values()
        facts, model_dir = loaded.facts, loaded.model_dir
    warn_if_distilled(facts.distilled)
    if flow.turbo_dit:
        check_turbo(flow.turbo_dit, modules["transformer"])
    return Components(
        denoiser=modules["transformer"],
        vae=modules["vae"],
        text_encoders=(modules["text_encoder"],),
        tokenizers=(tokenizer,),
        objective=Krea2FlowObjective(krea2_flow_options(flow), facts.scheduler, patch=PATCH),
        family=krea2_family(facts.taps, facts.distilled, flow.turbo_dit),
        model_dir=model_dir,
    )


def _facts(folder: CheckedFolder) -> FolderFacts:
    """The folder's scheduler config and the pipeline's taps and is_distilled."""
    index = read_json(folder.model_dir / "model_index.json")
    scheduler = read_json(folder.model_dir / "scheduler" / "scheduler_config.json")
    taps = tuple(index.get("text_encoder_select_layers") or spec.TAPS)
    layers = folder.part_config("transformer").get("num_text_layers", len(spec.TAPS))
    if len(taps) != layers:
        raise ModelError(
            f"{folder.model_dir / 'model_index.json'}: text_encoder_select_layers names "
            f"{len(taps)} layers and the transformer reads {layers}; the folder is inconsistent"
        )
    return FolderFacts(scheduler, taps, bool(index.get("is_distilled", False)))


def _tokenizer(folder: CheckedFolder):
    """The folder's Qwen3-VL tokenizer, or tokenizer_path's."""
    return folder_or_path_tokenizer(
        folder.model_dir, folder.model.tokenizer_path, "Qwen3-VL", files.TOKENIZER_WHERE
    )


# A Krea2Pipeline folder.
FOLDER = PipelineFolder(
    pipeline=spec.PIPELINE,
    family="Krea 2",
    parts=(
        FolderPart("transformer", f"diffusers:{spec.TRANSFORMER_CLASS}"),
        FolderPart("vae", "diffusers:AutoencoderKLQwenImage", "vae", vae=True),
        FolderPart("text_encoder", "transformers:Qwen3VLModel", "text_encoder"),
    ),
    tokenizers=(FolderTokenizer("tokenizer", _tokenizer),),
    plan_file=files.plan_component,
    other={"scheduler": "scheduler_config.json"},
    inspect=_facts,
)
