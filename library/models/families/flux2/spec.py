"""FLUX.2's loading facts as data (diffusers 0.42.1, Black Forest Labs' and Comfy-Org's files).

- pipelines: Flux2KleinPipeline (klein 4B / 9B, base and distilled: one architecture; the
  distilled repositories' model_index.json adds ``"is_distilled": true``), Flux2Pipeline (dev);
- parts: transformer/ (Flux2Transformer2DModel), vae/ (AutoencoderKLFlux2, 32 channels),
  text_encoder/ (klein: Qwen3ForCausalLM, Qwen3-4B or -8B; dev: Mistral3ForConditionalGeneration),
  tokenizer/, scheduler/;
- the transformer's original (Black Forest Labs) names and diffusers' (names.py);
- Black Forest Labs' single files: ``flux-2-klein-4b.safetensors``, ``flux-2-klein-base-4b``,
  ``flux-2-klein-9b``, ``flux-2-klein-base-9b`` (and ``-fp8``), ``flux2-dev.safetensors``;
  Comfy-Org's: ``flux2_dev_fp8mixed.safetensors``, ``qwen_3_4b.safetensors``,
  ``qwen_3_8b_fp8mixed.safetensors``, ``flux2-vae.safetensors``;
- training (Flux2KleinPipeline / Flux2Pipeline over FlowMatchEulerDiscreteScheduler): x_t =
  (1 - sigma) x0 + sigma noise; the transformer takes the scheduler's timestep / 1000 and
  returns the velocity noise - x0. musubi-tuner trains with ``timestep_sampling flux2_shift``:
  sigmoid(z) shifted by exp(mu), mu on FLUX.1's line through (256, 0.5) and (4096, 1.15) at the
  image's token count (h * w of the patched latent): ``flux_shift`` on FLUX.2's tokens, the raw
  output as the prediction, no loss weighting (DRAW).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from library.models.checkpoint_file import CheckpointFile
from library.models.families.batchnorm_vae_file import VAE_CLASS, plan_batchnorm_vae
from library.models.families.file_plans import (
    as_qwen3_causal_lm,
    plan_qwen3_file,
)
from library.models.families.flow_options import check_model_version
from library.models.families.flux2.names import TABLE, TRANSFORMER_CLASS
from library.models.families.folder_loader import CheckedFolder, check_width
from library.models.families.local_tokenizer import tokenizer_part
from library.models.families.mistral3_file import plan_mistral3_file
from library.models.families.name_table import dual_single_sizes
from library.models.families.spec import ComponentFile, FamilySpec, MainFile, SpecPart
from library.models.families.transformer_family import TrainerDraw
from library.models.model_files import read_json
from library.models.plans import Plan
from library.models.released_configs import qwen3_4b_config
from library.training import flow_matching as fm
from library.training.objectives import VelocityObjective

PIPELINES = {"klein": "Flux2KleinPipeline", "dev": "Flux2Pipeline"}
_TIME = "time_guidance_embed"
TEXT_ENCODER_CLASS = {
    "klein": "transformers:Qwen3ForCausalLM",
    "dev": "transformers:Mistral3ForConditionalGeneration",
}
QWEN3_WHAT = "the Qwen3 text encoder (qwen_3_4b.safetensors)"
MISTRAL3_FILE = "mistral_3_small_flux2_bf16.safetensors"
MISTRAL3_WHAT = f"the Mistral 3 text encoder ({MISTRAL3_FILE})"
VAE_FIX = ("set [model] vae to flux2-vae.safetensors or a diffusers AutoencoderKLFlux2 folder (a "
           "FLUX.2 diffusers folder's vae/)")  # fmt: skip
_TOKENIZER_HINTS = {"klein": "a FLUX.2 [klein] diffusers folder's tokenizer/, or Qwen/Qwen3-4B's",
                    "dev": "a FLUX.2 [dev] diffusers folder's tokenizer/"}  # fmt: skip
# Black Forest Labs' transformer files, told apart by dev's guidance input (original, diffusers).
RELEASED_FILES = {"klein": "flux-2-klein-base-4b.safetensors", "dev": "flux2-dev.safetensors"}
GUIDANCE_MARKS = ("guidance_in.in_layer.weight", f"{_TIME}.guidance_embedder.linear_1.weight")
# The text encoder's hidden states the pipelines stack per token (text_encoder_out_layers).
TEXT_LAYERS = {"klein": (9, 18, 27), "dev": (10, 20, 30)}
MAX_TOKENS = 512  # the pipelines' max_sequence_length
# Reference images sit at T = 10, 20, ... on the first position axis (_prepare_image_ids).
REFERENCE_T_STEP = 10

# The released transformers' configs (their config.json), by model.
RELEASED = {
    "klein-4b": dict(num_layers=5, num_single_layers=20, num_attention_heads=24,
                     joint_attention_dim=7680, guidance_embeds=False),
    "klein-9b": dict(num_layers=8, num_single_layers=24, num_attention_heads=32,
                     joint_attention_dim=12288, guidance_embeds=False),
    "dev": dict(num_layers=8, num_single_layers=48, num_attention_heads=48,
                joint_attention_dim=15360, guidance_embeds=True),
}  # fmt: skip
# What the shapes do not show (the transformer takes patched latents: patch_size 1).
COMMON = dict(patch_size=1, out_channels=None, rope_theta=2000, eps=1e-6)
# The released schedulers: sigmas shifted by exp(mu), mu from the image's token count and the
# step count (the pipelines' compute_empirical_mu).
SCHEDULER_CONFIG = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                        base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                        max_image_seq_len=4096, time_shift_type="exponential")  # fmt: skip
# musubi-tuner's draw, and the keys its FLUX.2 trainer records (dev's guidance: family.py)
DRAW = TrainerDraw({"timestep_sampling": "flux_shift", "weighting_scheme": "none",
                    "model_prediction_type": "raw"},
                   ("timestep_sampling", "sigmoid_scale", "discrete_flow_shift",
                    "weighting_scheme", "model_prediction_type"))  # fmt: skip
DISTILLED_KEY = "difftune.flux2.distilled"  # a transformer file's header: base or distilled


class Flux2FlowObjective(VelocityObjective):
    """The shared velocity objective with the pipelines' timestep input."""

    LABEL = "FLUX.2"
    # musubi-tuner's flux2_shift: FLUX.1's line at the patched latent's h * w, which flux_shift
    # already counts on FLUX.2 (patch 1)
    OWN_SHIFTS = {"flux2_shift": fm.flux_mu}

    def model_time(self, t):
        # as the pipeline computes it from the scheduler's timestep (sigma * 1000) / 1000
        return fm.sigma_to_timestep(t) / fm.NUM_TRAIN_TIMESTEPS


def transformer_config(shapes: Mapping[str, tuple[int, ...]]) -> dict:
    """Flux2Transformer2DModel kwargs for diffusers-named shapes (the rotary axes: a quarter of
    the head width each)."""
    sizes, inner = dual_single_sizes(shapes), shapes["x_embedder.weight"][0]
    return {**COMMON, **sizes, "axes_dims_rope": (sizes["attention_head_dim"] // 4,) * 4,
            "timestep_guidance_channels": shapes[f"{_TIME}.timestep_embedder.linear_1.weight"][1],
            "mlp_ratio": shapes["single_transformer_blocks.0.attn.to_out.weight"][1] / inner - 1,
            "guidance_embeds": any(k.startswith(f"{_TIME}.guidance") for k in shapes)}  # fmt: skip


def plan_qwen3(file: CheckpointFile) -> Plan:
    """Qwen3 (Comfy-Org's qwen_3_4b.safetensors) by the shared reader, as the folder's
    Qwen3ForCausalLM; its sizes read over Qwen3-4B's (klein 4B's text encoder)."""
    return as_qwen3_causal_lm(plan_qwen3_file(
        file, "text_encoder", QWEN3_WHAT, "qwen_3_4b.safetensors (klein 4B) or "
        "qwen_3_8b_fp8mixed.safetensors (9B)", qwen3_4b_config()))  # fmt: skip


def plan_mistral3(file: CheckpointFile) -> Plan:
    """Mistral 3 (Comfy-Org's file) by the shared reader, as far as dev's deepest layer."""
    reads = max(TEXT_LAYERS["dev"])
    return plan_mistral3_file(file, "text_encoder", MISTRAL3_WHAT, MISTRAL3_FILE, reads)


def _vae_file(file: CheckpointFile) -> Plan:
    return plan_batchnorm_vae(file, "vae", "FLUX.2 VAE", VAE_FIX)


def model_of(config: Mapping) -> tuple[str, str]:
    """(model, size) of a transformer config: ("klein", "4b"), ("klein", "9b"), ("dev", "32b");
    another shape is a klein (no guidance input) or dev of size "custom"."""
    for name, released in RELEASED.items():
        if all(config.get(k) == v for k, v in released.items()):
            model, _, size = name.partition("-")
            return model, size or "32b"
    return ("dev" if config.get("guidance_embeds") else "klein"), "custom"


def inspect(checked) -> bool:
    """Whether the model is distilled (model_index.json's ``is_distilled``, a file's header or
    name, else [flow] model_version); ModelError when the text encoder's three states do not
    make the transformer's text width, or model_version names another model than the files."""
    text = checked.part_config("text_encoder")
    check_width(checked, "text_encoder", 3 * text.get("text_config", text)["hidden_size"],
                "joint_attention_dim", "states", "set text_encoder to this model's (klein 4B: "
                "qwen_3_4b, 9B: qwen_3_8b, dev: mistral_3_small_flux2_bf16)")  # fmt: skip
    told, version = _told_distilled(checked), checked.flow.model_version
    if version is None:
        return bool(told)
    model, size = model_of(checked.config)
    # musubi-tuner's values: dev, klein-4b, klein-base-4b, klein-9b, klein-base-9b
    distilled = model == "klein" and ("base" not in version if told is None else told)
    if size == "custom":  # a klein of other sizes (a test's): the value's, else 4b
        size = (version.split("-")[1:] or ["4b"])[-1]
    fit = "dev" if model == "dev" else f"klein-{'' if distilled else 'base-'}{size}"
    check_model_version(version, (fit,), checked.model_dir, f"a {fit} model by its files")
    return distilled


def _told_distilled(checked) -> bool | None:
    """Whether the files say the model is distilled; None where a file's name and header do
    not tell."""
    if isinstance(checked, CheckedFolder):
        return bool(read_json(checked.model_dir / "model_index.json").get("is_distilled"))
    file = checked.plans["transformer"].file
    stored, name = file.metadata.get(DISTILLED_KEY), file.path.name.lower()
    if stored in ("true", "false"):
        return stored == "true"
    return "base" not in name if "klein" in name else None  # Black Forest Labs' names


def _spec(kind: str) -> FamilySpec:
    what, plan = (QWEN3_WHAT, plan_qwen3) if kind == "klein" else (MISTRAL3_WHAT, plan_mistral3)
    guidance = [(mark,) if kind == "dev" else () for mark in GUIDANCE_MARKS]
    return FamilySpec(
        family="FLUX.2 (klein or dev)",
        pipeline=PIPELINES[kind],
        parts=(
            SpecPart(
                "denoiser", "transformer", f"diffusers:{TRANSFORMER_CLASS}", label="FLUX.2 transformer",
                main=MainFile(
                    names=TABLE,
                    # the shared modulation tells FLUX.2 from FLUX.1
                    original_marks=("double_stream_modulation_img.lin.weight", *guidance[0]),
                    diffusers_marks=("double_stream_modulation_img.linear.weight", *guidance[1]),
                    config_from_shapes=transformer_config,
                    damaged=re.compile(r'"(model\.diffusion_model\.)?double_stream_modulation_img\.'),
                    example=RELEASED_FILES[kind],
                ),
            ),
            SpecPart(
                "vae", "vae", VAE_CLASS,
                file=ComponentFile("vae", "[model]", "the FLUX.2 VAE (flux2-vae.safetensors or a diffusers "
                                   "AutoencoderKLFlux2 folder)", _vae_file, folders=True),
            ),
            SpecPart("text_encoder", "text_encoder", TEXT_ENCODER_CLASS[kind],
                     file=ComponentFile("text_encoder", "[flow]", what, plan)),
        ),
        tokenizers=(tokenizer_part("FLUX.2", _TOKENIZER_HINTS[kind]),),
        inspect=inspect,
        other={"scheduler": "scheduler_config.json"},
    )  # fmt: skip


SPECS = {kind: _spec(kind) for kind in PIPELINES}
