"""FLUX.2 from the single files users have: Black Forest Labs' transformer file
(pretrained_model_name_or_path: ``flux-2-klein-base-4b.safetensors`` and the like, original names
with or without ComfyUI's ``model.diffusion_model.``), the Qwen3 text encoder ([flow]
text_encoder: Comfy-Org's ``qwen_3_4b.safetensors`` / ``qwen_3_8b...``, transformers' names
under ``model.``, with or without the LM head), the VAE ([model] vae: a diffusers
AutoencoderKLFlux2 folder, such as a FLUX.2 folder's vae/) and tokenizer_path's Qwen3 tokenizer.

Each file's header is read and every tensor's name and shape checked against the module it
fills before any weight is read (file_plans); a file's config is its header's
(``difftune.config.<part>``) when it fits, else the released one with the sizes its shapes show.
Base or distilled: difftune's header says (``difftune.flux2.distilled``), else the name does
(a klein file without "base" in its name is the distilled model, as Black Forest Labs names
them).
"""

from __future__ import annotations

from pathlib import Path

import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.file_plans import (
    family_component_file,
    load_plan,
    open_safetensors,
    plan_part,
    refuse_scaled_fp8,
)
from library.models.families.flux2 import names, spec
from library.models.families.local_tokenizer import load_local_tokenizer
from library.models.loader import load_weights, offline

FAMILY = "FLUX.2"
DISTILLED_KEY = "difftune.flux2.distilled"
TEXT = "model."  # transformers' Qwen3ForCausalLM names its decoder so
_TIME = "time_guidance_embed.timestep_embedder"


def load_flux2_files(
    path: Path, model: ModelSection, flow: FlowSection, weight_dtype, vae_dtype
) -> tuple:
    """(transformer, vae, text encoder, tokenizer, distilled) of the transformer file ``path``
    and its component files; ModelError for any problem, found before any weight is read."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist; nothing is downloaded")
    file = open_safetensors(path, "pretrained_model_name_or_path", FAMILY)
    transformer = plan_transformer(file)
    text = plan_text_encoder(
        family_component_file(flow.text_encoder, "text_encoder", "[flow]",
                              "the Qwen3 text encoder (qwen_3_4b.safetensors)", FAMILY)
    )  # fmt: skip
    check_text_width(
        3 * text.config["hidden_size"], transformer.config["joint_attention_dim"],
        f"text_encoder = {text.file.path}",
    )  # fmt: skip
    tokenizer = load_local_tokenizer(
        model.tokenizer_path, text.config["vocab_size"], path, "Qwen3",
        "a FLUX.2 [klein] diffusers folder's tokenizer/, or Qwen/Qwen3-4B's",
    )  # fmt: skip
    with offline():
        vae = load_vae_folder(model.vae, vae_dtype)
        modules = load_plan(transformer, weight_dtype), load_plan(text, weight_dtype)
    return modules[0], vae, modules[1], tokenizer, distilled_file(file)


def check_text_width(width: int, takes: int, source: str) -> None:
    """ModelError naming ``source`` when its states (``width``) are not the transformer's text
    input (``takes``)."""
    if width != takes:
        raise ModelError(
            f"{source} gives {width}-wide states and the transformer takes {takes}: set "
            "text_encoder to this model's (klein 4B: qwen_3_4b, 9B: qwen_3_8b)"
        )


def distilled_file(file) -> bool:
    """Whether the transformer file is a distilled klein (module docstring)."""
    stored = file.metadata.get(DISTILLED_KEY)
    if stored in ("true", "false"):
        return stored == "true"
    name = file.path.name.lower()
    return "klein" in name and "base" not in name


def load_vae_folder(value: str | None, dtype: torch.dtype) -> torch.nn.Module:
    """[model] vae: AutoencoderKLFlux2 in a folder (config.json and its weights, or vae/)."""
    from diffusers import AutoencoderKLFlux2

    path = Path(value or "").expanduser().absolute()
    if not value or not path.is_dir():
        raise ModelError(
            f"vae = {value!r}: FLUX.2 as single files needs [model] vae set to a diffusers "
            "AutoencoderKLFlux2 folder (a FLUX.2 diffusers folder's vae/)"
        )
    model_dir, sub = (path, "vae") if (path / "vae").is_dir() else (path.parent, path.name)
    vae = load_weights(AutoencoderKLFlux2, model_dir, sub, dtype)
    return vae.requires_grad_(False).eval()


def plan_transformer(file):
    """The transformer in the original names (``model.diffusion_model.`` or none)."""
    what = "pretrained_model_name_or_path"
    refuse_scaled_fp8(file, what)
    prefix = names.detect(file.keys())
    if prefix is None:
        raise ModelError(
            f"{file.path} holds no FLUX.2 transformer (no double_stream_modulation_img); point "
            "pretrained_model_name_or_path at flux-2-klein-base-4b.safetensors or a folder"
        )
    keys = [k for k in file if k.startswith(prefix)]

    def from_shapes(shapes: dict) -> dict:
        head = shapes["single_transformer_blocks.0.attn.norm_q.weight"][0]
        inner, channels = shapes["x_embedder.weight"]
        count = {b: len({k.split(".")[1] for k in shapes if k.startswith(b + ".")})
                 for b in ("transformer_blocks", "single_transformer_blocks")}  # fmt: skip
        return {**spec.COMMON, "num_layers": count["transformer_blocks"],
                "num_single_layers": count["single_transformer_blocks"],
                "attention_head_dim": head, "num_attention_heads": inner // head,
                "axes_dims_rope": (head // 4,) * 4, "in_channels": channels,
                "joint_attention_dim": shapes["context_embedder.weight"][1],
                "timestep_guidance_channels": shapes[f"{_TIME}.linear_1.weight"][1],
                "mlp_ratio": shapes["single_transformer_blocks.0.attn.to_out.weight"][1] / inner - 1,
                "guidance_embeds": any(k.startswith("time_guidance_embed.guidance") for k in shapes)}  # fmt: skip

    return plan_part(
        "transformer", what, file, keys, lambda state: names.to_diffusers(state, prefix),
        _build_transformer, from_shapes,
        lambda exc: ModelError(f"{file.path}: not a whole FLUX.2 transformer ({exc})"),
        label="FLUX.2 transformer", group=_block,
    )  # fmt: skip


def _block(key: str) -> str:
    parts = key.split(".")
    index = next((i for i, p in enumerate(parts) if p.endswith("_blocks")), None)
    return ".".join(parts[: index + 2]) if index is not None else ""


def plan_text_encoder(file):
    """Qwen3 in transformers' names with or without ``model.``; without an LM head in the file
    the head is tied to the embeddings (it is never used: only hidden states are read)."""
    what = "text_encoder"
    refuse_scaled_fp8(file, what)
    prefix = TEXT if any(k.startswith(TEXT + "layers.") for k in file) else ""
    if f"{prefix}layers.0.self_attn.q_norm.weight" not in file:
        raise ModelError(
            f"text_encoder = {file.path} is no Qwen3 (no {prefix}layers.0.self_attn.q_norm); "
            "set text_encoder in [flow] to qwen_3_4b.safetensors (klein 4B) or qwen_3_8b (9B)"
        )
    keys = [k for k in file if k.startswith(prefix) or k == "lm_head.weight"]
    tied = "lm_head.weight" not in keys

    def convert(state):
        out = {
            (k if k == "lm_head.weight" else TEXT + k[len(prefix) :]): v for k, v in state.items()
        }
        if tied and TEXT + "embed_tokens.weight" in out:
            out["lm_head.weight"] = out[TEXT + "embed_tokens.weight"]
        return out

    def from_shapes(shapes: dict) -> dict:
        layers = {k.split(".")[2] for k in shapes if k.startswith(TEXT + "layers.")}
        head = shapes[TEXT + "layers.0.self_attn.q_norm.weight"][0]
        return {**spec.TEXT_ENCODERS["klein-4b"], "hidden_size": shapes[TEXT + "embed_tokens.weight"][1],
                "vocab_size": shapes[TEXT + "embed_tokens.weight"][0], "head_dim": head,
                "num_hidden_layers": len(layers),
                "num_attention_heads": shapes[TEXT + "layers.0.self_attn.q_proj.weight"][0] // head,
                "num_key_value_heads": shapes[TEXT + "layers.0.self_attn.k_proj.weight"][0] // head,
                "intermediate_size": shapes[TEXT + "layers.0.mlp.up_proj.weight"][0]}  # fmt: skip

    return plan_part(
        "text_encoder", what, file, keys, convert, _build_qwen3,
        from_shapes, lambda exc: ModelError(f"text_encoder = {file.path}: not a whole Qwen3 ({exc})"),
        fixed={"tie_word_embeddings": True} if tied else None, label="Qwen3 text encoder",
        tied=tied,
    )  # fmt: skip


def _build_transformer(config: dict) -> torch.nn.Module:
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel.from_config(config)


def _build_qwen3(config: dict) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**config))
