"""Loading Qwen-Image (and its edit releases): their folders and single files as spec.py
declares them, read by the shared loader (library/models/families/spec_loader.py), which checks
every header, shape and weights file before anything loads; nothing is downloaded.

A transformer file does not say which release it is: [flow] model_version does (musubi-tuner's
--model_version; unset: the text-to-image model), and a folder's model_index.json must agree
with it when it is set."""

from __future__ import annotations

from pathlib import Path

import torch

from library.config.flow_section import FlowSection
from library.config.model_schema import ModelSection
from library.errors import ModelError
from library.models.components import Components
from library.models.families.qwenimage.config_keys import check_folder_version
from library.models.families.qwenimage.family import qwenimage_family
from library.models.families.qwenimage.objective import DRAW, QwenImageFlowObjective
from library.models.families.qwenimage.spec import SPEC
from library.models.families.spec import FamilySpec
from library.models.families.spec_loader import components, load_spec


def load_qwenimage(
    model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype, vae_dtype: torch.dtype
) -> Components:
    """Components of Qwen-Image as a diffusers folder or single files: the transformer, the
    video VAE, Qwen2.5-VL and its tokenizer, frozen, in eval mode, on the CPU, in
    ``weight_dtype`` (the VAE in ``vae_dtype``). ModelError for any problem with the files."""
    path = Path(model.pretrained_model_name_or_path).expanduser()
    if not path.is_dir() and flow.model_version not in (None, "original"):
        # an edit release's claim takes its file
        raise ModelError(f"model_version = {flow.model_version}: not a Qwen-Image file")
    return load_release(SPEC, qwenimage_family(flow), model, flow, weight_dtype, vae_dtype)


def load_release(
    spec: FamilySpec, family, model: ModelSection, flow: FlowSection, weight_dtype: torch.dtype,
    vae_dtype: torch.dtype,
) -> Components:  # fmt: skip
    """Components of the release ``spec`` declares (Qwen-Image's or an edit model's, whose
    ModelFamily is ``family``): its modules and every tokenizer it declares, in order."""
    path = Path(model.pretrained_model_name_or_path).expanduser().absolute()
    if path.is_dir():
        check_folder_version(flow, spec.pipeline, path)
    loaded = load_spec(spec, model, flow, weight_dtype, vae_dtype)
    objective = QwenImageFlowObjective(DRAW.options(flow), loaded.facts)  # scheduler
    return components(spec, loaded, objective, family)
