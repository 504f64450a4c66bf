"""Loading FLUX.2: which models are FLUX.2, and its diffusers pipeline folders.

A Flux2KleinPipeline or Flux2Pipeline folder holds transformer/, vae/, text_encoder/,
tokenizer/ and scheduler/; the shared folder loader checks every part and weights file before
anything loads, and nothing is downloaded. The model (klein 4B, 9B, dev) is told by the
transformer's config, base from distilled by model_index.json's ``is_distilled``.
"""

from __future__ import annotations

import dataclasses
import re
from functools import partial
from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.claims import claims_model, file_claimed, folder_pipeline
from library.models.families.file_plans import family_component_file
from library.models.families.flux2 import files, names, spec
from library.models.families.flux2.family import flux2_family
from library.models.families.flux2.objective import Flux2FlowObjective, flux2_flow_options
from library.models.families.folder_loader import (
    CheckedFolder,
    FolderPart,
    FolderTokenizer,
    PipelineFolder,
    load_folder,
)
from library.models.loader import Components, read_json

FAMILY = "FLUX.2 (klein or dev)"
_DAMAGED_MARKS = re.compile(r'"(model\.diffusion_model\.)?double_stream_modulation_img\.')


def claims_flux2(model: ModelSection, flow: FlowSection) -> bool:
    """True for a Flux2KleinPipeline or Flux2Pipeline folder, or a FLUX.2 transformer file
    (damaged ones by their header text); ModelError for a folder of another FLUX.2 pipeline."""
    path = Path(model.pretrained_model_name_or_path).expanduser()
    if path.is_dir():
        if folder_pipeline(path) in spec.PIPELINES.values():
            return True
        return claims_model(
            model, spec.PIPELINES["klein"], spec.TRANSFORMER_CLASS, names.detect,
            _DAMAGED_MARKS, FAMILY,
        )  # fmt: skip
    return file_claimed(path, names.detect, _DAMAGED_MARKS)


def model_of(config: dict) -> tuple[str, str]:
    """(model, size) of a transformer config: ("klein", "4b"), ("klein", "9b"), ("dev", "32b");
    another shape is a klein (no guidance input) or dev of size "custom"."""
    for name, released in spec.RELEASED.items():
        if all(config.get(k) == v for k, v in released.items()):
            model, _, size = name.partition("-")
            return model, size or "32b"
    return ("dev" if config.get("guidance_embeds") else "klein"), "custom"


def load_flux2(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of a FLUX.2 folder: the transformer, the VAE, the text encoder and its
    tokenizer, frozen, in eval mode, on the CPU, in ``weight_dtype`` (the VAE in ``vae_dtype``).
    ModelError for any problem with the files."""
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if path.is_dir():
        kind = "dev" if folder_pipeline(path) == spec.PIPELINES["dev"] else "klein"
        loaded = load_folder(folder_spec(kind), path, model, flow, weight_dtype, vae_dtype)
        transformer, vae, encoder = loaded.modules.values()
        (tokenizer,), (scheduler, distilled) = loaded.tokenizers.values(), loaded.facts
        path = loaded.model_dir
    else:
        transformer, vae, encoder, tokenizer, distilled = files.load_flux2_files(
            path, model, flow, weight_dtype, vae_dtype
        )
        scheduler = dict(spec.SCHEDULER_CONFIG)
    name, size = model_of(dict(transformer.config))
    return Components(
        denoiser=transformer,
        vae=vae,
        text_encoders=(encoder,),
        tokenizers=(tokenizer,),
        objective=Flux2FlowObjective(flux2_flow_options(flow), scheduler),
        family=flux2_family(name, size, distilled, flow),
        model_dir=path,
    )


def _inspect(folder: CheckedFolder) -> tuple[dict, bool]:
    """(the sampling scheduler's config, whether model_index.json says the model is distilled);
    ModelError when the text encoder's three states do not make the transformer's text width."""
    text = folder.part_config("text_encoder")
    width = 3 * text.get("text_config", text)["hidden_size"]
    files.check_text_width(
        width, folder.config["joint_attention_dim"], folder.part_source("text_encoder")
    )
    scheduler = read_json(folder.model_dir / "scheduler" / "scheduler_config.json")
    scheduler = {k: v for k, v in scheduler.items() if not k.startswith("_")}
    index = read_json(folder.model_dir / "model_index.json")
    return scheduler, bool(index.get("is_distilled", False))


def _tokenizer(folder: CheckedFolder):
    """The folder's tokenizer/, or tokenizer_path's."""
    from transformers import AutoTokenizer

    where = folder.model.tokenizer_path or str(folder.model_dir / "tokenizer")
    try:
        # dev's tokenizer/ is a Pixtral processor: its tokenizer holds the same chat template
        return AutoTokenizer.from_pretrained(where, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"cannot read the FLUX.2 text encoder's tokenizer in {where}: {exc}"
        ) from None


def _plan_file(key: str, value: str):
    """[flow] text_encoder's Qwen3 file, or [model] vae's folder, in place of the folder's."""
    if key == "vae":
        return partial(files.load_vae_folder, value)
    what = "the Qwen3 text encoder (qwen_3_4b.safetensors)"
    return files.plan_text_encoder(family_component_file(value, key, "[flow]", what, files.FAMILY))


_KLEIN = PipelineFolder(
    pipeline=spec.PIPELINES["klein"],
    family=FAMILY,
    parts=(
        FolderPart("transformer", f"diffusers:{spec.TRANSFORMER_CLASS}"),
        FolderPart("vae", f"diffusers:{spec.VAE_CLASS}", "vae", vae=True),
        FolderPart("text_encoder", spec.TEXT_ENCODER_CLASS["klein"], "text_encoder"),
    ),
    tokenizers=(FolderTokenizer("tokenizer", _tokenizer),),
    plan_file=_plan_file,
    other={"scheduler": "scheduler_config.json"},
    inspect=_inspect,
)


def folder_spec(kind: str) -> PipelineFolder:
    """The pipeline folder of ``kind`` ("klein" or "dev")."""
    if kind == "klein":
        return _KLEIN
    encoder = FolderPart("text_encoder", spec.TEXT_ENCODER_CLASS["dev"])
    return dataclasses.replace(
        _KLEIN, pipeline=spec.PIPELINES["dev"], parts=(*_KLEIN.parts[:2], encoder)
    )
