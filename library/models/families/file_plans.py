"""The transformer families' single files: plans (library/models/plans.py) for the parts
several families read, each checked on its shapes before any weight is read.

``plan_with_config`` / ``plan_part`` give a part the config stored in the file's header
(``difftune.config.<part>``) when it fits, else one derived from the tensor shapes; the shared
parts are T5 v1.1 encoders, CLIP text encoders, the 16-channel autoencoder without quant convs;
component files are opened and checked here too.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from library.errors import ModelError
from library.models import original_names as names
from library.models import released_configs, shape_configs
from library.models.checkpoint_file import PICKLE_SUFFIXES, CheckpointFile
from library.models.families.file_contents import looks_like
from library.models.families.shape_origins import convert_shapes
from library.models.model_files import one_line
from library.models.plans import Convert, Plan, choose_plan, load_plan

# The plan system's Plan and load_plan, for the families that read them from here.
__all__ = ["Convert", "Plan", "load_plan"]


def open_safetensors(path: Path, what: str, family: str, pickles: bool = False) -> CheckpointFile:
    """``path``'s header, read; ModelError naming ``what`` for another format or a broken file.
    ``pickles``: a torch file (.pth, as Wan-AI ship theirs) is read too, tensors only."""
    torch_file = pickles and path.suffix.lower() in PICKLE_SUFFIXES
    if path.suffix.lower() != ".safetensors" and not torch_file:
        raise ModelError(
            f"{what} = {path}: {family} component files are read as .safetensors only; convert "
            "the file with a tool you trust"
        )
    try:
        return CheckpointFile(path, label=f"the {family} file")
    except ModelError as exc:
        raise ModelError(f"{what}: {exc}") from None


def plan_clip_encoder(
    file: CheckpointFile, what: str, keys: list[str], part: str, label: str, base: dict,
    convert: Convert, build: Callable[[dict], torch.nn.Module],
    wrong: Callable[[str], ModelError],
) -> Plan:  # fmt: skip
    """A CLIP text encoder from ``keys`` of ``file`` renamed by ``convert``, as ``part``
    (``label`` in errors), its config ``base`` with the sizes the tensors show; ``wrong(problem)``:
    the error for a file that holds none."""

    def from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict:
        config = shape_configs.text_config_from_shapes(shapes, base)
        note_derived(what, file, config, base, "num_attention_heads")
        return config

    return plan_part(
        part, what, file, keys, convert, build, from_shapes,
        lambda exc: wrong(f"it lacks {exc}"), label=label,
    )  # fmt: skip


def note_derived(what: str, file: CheckpointFile, config: dict, base: dict, guessed: str) -> None:
    """Warn that a file's sizes differ from the released model's (``base``) and which field had
    to be guessed."""
    if any(config.get(k) != v for k, v in base.items() if k != guessed):
        shape_configs.note_guesses(f"{what} {file.path.name}", config, (guessed,))


def plan_with_config(
    part: str, plan_of: Callable[[dict], Plan], file: CheckpointFile, derive: Callable[[], dict]
) -> Plan:
    """The plan with the file's stored config if it fits, else with ``derive()``'s (plans.py's
    choose_plan, which refuses a file cut short of what its header promises)."""
    return choose_plan(part, plan_of, file, (("derived", derive),))


def plan_part(
    part: str, what: str, file: CheckpointFile, keys: list[str], convert: Convert,
    build: Callable[[dict], torch.nn.Module], from_shapes: Callable[[dict], dict],
    misfit: Callable[[Exception], ModelError], fixed: Mapping[str, object] | None = None,
    **fields: Any,
) -> Plan:  # fmt: skip
    """The plan of ``part`` from ``keys`` of ``file`` (Plan's fields; ``fields``: its optional
    ones) with the file's stored config when it fits, else ``from_shapes`` of the renamed
    tensors' shapes; ``misfit(exc)`` is the error when those give no config. ``fixed``: config
    values kept whatever config is chosen."""

    def plan_of(config: dict) -> Plan:
        return Plan(part, what, file, keys, {**config, **(fixed or {})}, convert, build, **fields)

    def derive() -> dict:
        try:
            return from_shapes(convert_shapes(convert, {k: file.shape(k) for k in keys}))
        except (KeyError, ValueError, IndexError, StopIteration) as exc:
            raise misfit(exc) from None

    return plan_with_config(part, plan_of, file, derive)


def component_file(key: str, value: str, what: str, family: str) -> CheckpointFile:
    """The [flow] file ``key`` names (``value``: a path), its header read; ModelError naming the
    key when it is a folder, missing or unreadable. ``what``: what the file must hold."""
    path = Path(value).expanduser().absolute()
    if path.is_dir():
        raise ModelError(
            f"{key} = {path} is a folder; set {key} in [flow] to the .safetensors file of {what}"
        )
    if not path.is_file():
        raise ModelError(f"{key} = {path} does not exist; set {key} in [flow] to {what}")
    return open_safetensors(path, key, family)


def family_component_file(
    value: str | None, key: str, section: str, what: str, family: str
) -> CheckpointFile:
    """The component file ``key`` (in ``section``) names beside a family's transformer file, its
    header read; ModelError naming the key when it is unset, a folder or missing. ``what``: what
    the file must hold, as messages say it."""
    if not value:
        raise ModelError(
            f'{family} as a single transformer file needs {what}: set {key} = "<path>" in '
            f"{section} (or point pretrained_model_name_or_path at a diffusers folder)"
        )
    path = Path(value).expanduser().absolute()
    if path.is_dir():
        raise ModelError(f"{key} = {path} is a folder; set {key} to {what}")
    if not path.is_file():
        raise ModelError(f"{key} = {path} does not exist; set {key} to {what}")
    return open_safetensors(path, key, family)


# --- T5 encoders --------------------------------------------------------------------------------

T5_EMBED = "shared.weight"
T5_EMBED_ALIAS = "encoder.embed_tokens.weight"
T5_FIRST_ATTENTION = "encoder.block.0.layer.0.SelfAttention."


def t5_encoder_keys(keys: Iterable[str], prefix: str = "") -> tuple[list[str], Convert]:
    """The keys of a T5 encoder under ``prefix`` and their converter to T5EncoderModel names
    (without the prefix). ValueError saying what is missing when there is no T5 encoder there.

    A whole T5 (encoder and decoder) also works: the decoder is left out. transformers 5 ties the
    embedding to both names; files carry one of them, or both.
    """
    keys = [k for k in keys if k.startswith(prefix)]
    present = {k[len(prefix) :] for k in keys}
    if not any(k.startswith(T5_FIRST_ATTENTION) for k in present):
        raise ValueError(f"it has no {prefix}{T5_FIRST_ATTENTION.rstrip('.')}")
    if T5_EMBED not in present and T5_EMBED_ALIAS not in present:
        raise ValueError(f"it has neither {prefix}{T5_EMBED} nor {prefix}{T5_EMBED_ALIAS}")
    embed = T5_EMBED if T5_EMBED in present else T5_EMBED_ALIAS

    def keep(key: str) -> bool:
        return not key.startswith(("decoder.", "lm_head.")) and (
            key == embed or key not in (T5_EMBED, T5_EMBED_ALIAS)
        )

    selected = [k for k in keys if keep(k[len(prefix) :])]

    def convert(state):
        out = {k[len(prefix) :]: v for k, v in state.items()}
        tensor = out.pop(embed)
        return {T5_EMBED: tensor, T5_EMBED_ALIAS: tensor, **out}

    return selected, convert


def plan_t5_encoder(
    file: CheckpointFile, what: str, prefix: str, part: str, label: str, base: dict,
    wrong: Callable[[str], ModelError], build: Callable[[dict], torch.nn.Module] | None = None,
) -> Plan:  # fmt: skip
    """The T5 encoder under ``prefix`` in ``file`` as ``part`` (``label`` in errors), its config
    ``base`` (T5 v1.1 XXL's) with the sizes the tensors show; ``wrong(problem)``: the error for a
    file that holds none. ``build``: the module from its config (unset: T5EncoderModel; umT5's
    files have the same names, with a position bias in every block)."""
    try:
        keys, convert = t5_encoder_keys(file.keys(), prefix)
    except ValueError as exc:
        raise wrong(str(exc)) from None
    return plan_part(
        part, what, file, keys, convert, build or build_t5,
        lambda shapes: t5_config_from_shapes(shapes, base),
        lambda exc: wrong(f"it lacks {exc}"), label=label, tied=True,
    )  # fmt: skip


def build_t5(config: dict) -> torch.nn.Module:
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(**config))


def t5_config_from_shapes(shapes: Mapping[str, tuple[int, ...]], base: dict) -> dict:
    """T5Config kwargs for T5EncoderModel-named shapes: ``base`` (T5 v1.1 XXL's config) with the
    sizes the tensors show (vocabulary, widths, heads, layers); every T5 size is visible in a
    shape."""
    vocab, d_model = shapes[T5_EMBED]
    buckets, heads = shapes[T5_FIRST_ATTENTION + "relative_attention_bias.weight"]
    gated = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight" in shapes
    d_ff = shapes[
        "encoder.block.0.layer.1.DenseReluDense." + ("wi_0" if gated else "wi") + ".weight"
    ]
    layers = 1 + max(
        int(m.group(1)) for k in shapes if (m := re.match(r"encoder\.block\.(\d+)\.", k))
    )
    return {
        **base,
        "vocab_size": vocab,
        "d_model": d_model,
        "d_kv": shapes[T5_FIRST_ATTENTION + "q.weight"][0] // heads,
        "d_ff": d_ff[0],
        "num_layers": layers,
        "num_decoder_layers": layers,
        "num_heads": heads,
        "relative_attention_num_buckets": buckets,
        "feed_forward_proj": base["feed_forward_proj"] if gated else "relu",
    }


# --- autoencoders -------------------------------------------------------------------------------


def ae_keys(
    keys: Iterable[str], prefixes: tuple[str, ...], from_original: Convert
) -> tuple[list[str], Convert]:
    """The keys of an autoencoder under the first of ``prefixes`` that has any (else the keys
    without a prefix) and their converter to AutoencoderKL names: SD's LDM names
    (``encoder.down.0.*``) are renamed by ``from_original``, diffusers' kept. ValueError when
    they are neither."""
    keys = list(keys)
    prefix = next((p for p in prefixes if any(k.startswith(p) for k in keys)), "")
    keys = [k for k in keys if k.startswith(prefix)]
    stripped = [k[len(prefix) :] for k in keys]
    if any(k.startswith("encoder.down.") for k in stripped):
        rename = from_original
    elif any(k.startswith("encoder.down_blocks.") for k in stripped):
        rename = dict
    else:
        raise ValueError(
            f"it has no {prefix}encoder.down.0.* (nor {prefix}encoder.down_blocks.0.*)"
        )

    def convert(state):
        return rename({k[len(prefix) :]: v for k, v in state.items()})

    return keys, convert


def plan_autoencoder(
    file: CheckpointFile, what: str, prefixes: tuple[str, ...], from_original: Convert,
    base: dict, label: str, latents: tuple[int, str] | None, wrong: Callable[[str], ModelError],
    fixed: Mapping[str, object] | None = None,
    build: Callable[[dict], torch.nn.Module] | None = None,
) -> Plan:  # fmt: skip
    """The autoencoder under the first of ``prefixes`` in ``file`` (ae_keys), its config ``base``
    with the sizes the tensors show, ``fixed`` kept; ``latents``: (channels, the family's name
    in messages) its latents must have, without quant convs (None: not checked); ``wrong(
    problem)``: the error for a file that holds no such autoencoder; ``build``: the module of a
    config (diffusers' AutoencoderKL by default)."""
    file.refuse_unreadable(what)
    try:
        keys, convert = ae_keys(file.keys(), prefixes, from_original)
    except ValueError as exc:
        raise wrong(str(exc)) from None

    def from_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict:
        config = ae_config_from_shapes(shapes, base)
        note_derived(what, file, config, base, "norm_num_groups")
        return config

    plan = plan_part(
        "vae", what, file, keys, convert, build or build_ae, from_shapes,
        lambda exc: wrong(f"its keys do not fit ({one_line(exc)})"), fixed, label=label,
    )  # fmt: skip
    # Checked on the plan, whatever config chose it: an SD checkpoint's own header describes
    # its 4-channel VAE exactly, and that VAE cannot encode these latents.
    problem = latent_problem(plan.config, *latents) if latents else None
    if problem:
        raise wrong(problem)
    return plan


def build_ae(config: dict) -> torch.nn.Module:
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_config(config)


def latent_problem(config: dict, channels: int, family: str) -> str | None:
    """Why an autoencoder ``config`` cannot serve a family whose latents have ``channels``
    channels and no quant convolutions (an SD VAE has 4 and both); None when it can."""
    latent, quant = config.get("latent_channels"), config.get("use_quant_conv", True)
    if latent == channels and not quant:
        return None
    convs = " and it has quant convs" if quant else ""
    return f"its latents have {latent} channels{convs}, {family} {channels} and none (an SD VAE?)"


def ae_config_from_shapes(shapes: Mapping[str, tuple[int, ...]], base: dict) -> dict:
    """AutoencoderKL kwargs for diffusers-named shapes: ``base`` with the sizes the tensors show.
    GroupNorm's group count does not show: ``base``'s where it divides every width."""
    levels = 1 + max(
        int(m.group(1)) for k in shapes if (m := re.match(r"encoder\.down_blocks\.(\d+)\.", k))
    )
    channels = [shapes[f"encoder.down_blocks.{i}.resnets.0.conv1.weight"][0] for i in range(levels)]
    per_block = len(
        {k.split(".")[4] for k in shapes if k.startswith("encoder.down_blocks.0.resnets.")}
    )
    groups = base["norm_num_groups"]
    if any(c % groups for c in channels):
        groups = math.gcd(groups, *channels)
    return {
        **base,
        "in_channels": shapes["encoder.conv_in.weight"][1],
        "out_channels": shapes["decoder.conv_out.weight"][0],
        "block_out_channels": tuple(channels),
        "down_block_types": ("DownEncoderBlock2D",) * levels,
        "up_block_types": ("UpDecoderBlock2D",) * levels,
        "layers_per_block": per_block,
        "latent_channels": shapes["decoder.conv_in.weight"][1],
        "norm_num_groups": groups,
        "use_quant_conv": "quant_conv.weight" in shapes,
        "use_post_quant_conv": "post_quant_conv.weight" in shapes,
        "mid_block_add_attention": any(
            k.startswith("encoder.mid_block.attentions.") for k in shapes
        ),
    }


# --- component files of the shared kinds ---------------------------------------------------------


def wrong_file(
    key: str, file: CheckpointFile, expected: str, problem: str, section: str = "[flow]"
) -> ModelError:
    """The error for the file ``key`` names when it holds something else than ``expected``."""
    return ModelError(
        f"{key} = {file.path} is not {expected}: {problem} (the file looks like "
        f"{looks_like(file.keys())}); set {key} in {section} to {expected}'s file"
    )


def plan_t5_file(
    file: CheckpointFile, key: str, part: str, label: str, base: dict | None = None
) -> Plan:
    """T5-XXL's encoder from the file ``key`` names, as ``part`` (its header entry's name), in
    T5EncoderModel names; its config ``base`` (T5 v1.1 XXL's) with the sizes its tensors show."""
    expected = "the T5-XXL text encoder"
    file.refuse_unreadable(key)
    return plan_t5_encoder(
        file, key, "", part, label, base or released_configs.t5_xxl_config(),
        lambda problem: wrong_file(key, file, expected, problem),
    )  # fmt: skip


def plan_ae16_file(
    file: CheckpointFile, key: str, label: str, family: str, section: str = "[flow]"
) -> Plan:
    """The 16-channel autoencoder (ae.safetensors: LDM names, or diffusers') from the file
    ``key`` names (in ``section``); ``family`` names whose latents it must make."""
    expected = "the 16-channel autoencoder (ae.safetensors)"
    return plan_autoencoder(
        file, key, ("first_stage_model.", "vae."), names.ldm_vae_from_original,
        released_configs.ae16_config(), label,
        (released_configs.AE16_LATENT_CHANNELS, f"{family}'s"),
        lambda problem: wrong_file(key, file, expected, problem, section),
    )  # fmt: skip


# --- Qwen3 text encoders ----------------------------------------------------------------------

QWEN3_PREFIX = "model."  # transformers' Qwen3ForCausalLM names its base model so
_QWEN3_UNUSED = ("lm_head.weight",)  # the LM head: Qwen3Model has none (tied to embed_tokens)
_QWEN3_MARK = "layers.0.self_attn.q_norm.weight"  # Qwen3's q/k norms (Qwen2 has none)


def qwen3_config_from_shapes(plain: Mapping[str, tuple[int, ...]], base: dict) -> dict:
    """Qwen3Config kwargs for Qwen3Model-named shapes: ``base`` with every size the tensors
    show (the position table's length does not show); KeyError naming a missing key."""
    vocab, hidden = plain["embed_tokens.weight"]
    head_dim = plain["layers.0.self_attn.q_norm.weight"][0]
    layers = 1 + max(int(m.group(1)) for k in plain if (m := re.match(r"layers\.(\d+)\.", k)))
    return {
        **base,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": plain["layers.0.mlp.gate_proj.weight"][0],
        "num_hidden_layers": layers,
        "num_attention_heads": plain["layers.0.self_attn.q_proj.weight"][0] // head_dim,
        "num_key_value_heads": plain["layers.0.self_attn.k_proj.weight"][0] // head_dim,
        "head_dim": head_dim,
        "attention_bias": "layers.0.self_attn.q_proj.bias" in plain,
    }


def plan_qwen3_file(
    file: CheckpointFile, key: str, expected: str, example: str, base: dict,
    label: str = "Qwen3 text encoder",
) -> Plan:  # fmt: skip
    """A Qwen3 text model from the file ``key`` names ([flow]), in transformers' names with or
    without ``model.``, a whole Qwen3ForCausalLM's LM head left out; its config ``base`` (the
    released model's) with the sizes its tensors show. ``expected``: what the file must hold,
    ``example``: its released file's name, as messages say them."""
    file.refuse_unreadable(key)
    prefix = QWEN3_PREFIX if any(k.startswith(QWEN3_PREFIX + "layers.") for k in file) else ""
    if prefix + _QWEN3_MARK not in file:
        vision = ("model.language_model.", "visual.", "model.visual.")
        looks = (
            "a Qwen vision-language model, not a Qwen3 text model"
            if any(k.startswith(vision) for k in file)
            else looks_like(file.keys())
        )
        raise ModelError(
            f"{key} = {file.path} is not {expected}: it has no {prefix}{_QWEN3_MARK} (the file "
            f"looks like {looks}); set {key} in [flow] to {example}"
        )
    keys = [k for k in file if k.startswith(prefix) and k not in _QWEN3_UNUSED]
    return plan_part(
        "text_encoder", key, file, keys,
        lambda state: {k[len(prefix) :]: v for k, v in state.items()}, build_qwen3,
        lambda shapes: qwen3_config_from_shapes(shapes, base),
        text_misfit(key, file, prefix, label), label=label, file_name=lambda name: prefix + name,
    )  # fmt: skip


def text_misfit(
    key: str, file: CheckpointFile, prefix: str, label: str
) -> Callable[[Exception], ModelError]:
    """The error of a text model's file (``key``'s, its keys under ``prefix``) whose tensors
    give no config: a missing key (KeyError) named, else its sizes fit no ``label``."""

    def misfit(exc: Exception) -> ModelError:
        problem = (
            f"it lacks {prefix}{exc.args[0]}, which the {label} has"
            if isinstance(exc, KeyError)
            else f"its tensors' sizes fit no {label}"
        )
        return ModelError(f"{key} = {file.path}: {problem}; re-download or re-convert it")

    return misfit


def build_qwen3(config: dict) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3Model

    return Qwen3Model(Qwen3Config(**config))


def as_qwen3_causal_lm(plan: Plan) -> Plan:
    """``plan_qwen3_file``'s plan as the Qwen3ForCausalLM a pipeline folder holds: the decoder
    under ``model.``, the LM head tied to the embeddings (only hidden states are read, so a
    file's own head is never needed and stays left out)."""
    plain, named = plan.convert, plan.file_name

    def convert(state):
        out = {QWEN3_PREFIX + k: v for k, v in plain(state).items()}
        if "model.embed_tokens.weight" in out:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        return out

    def build(config: dict) -> torch.nn.Module:
        from transformers import Qwen3Config, Qwen3ForCausalLM

        return Qwen3ForCausalLM(Qwen3Config(**config))

    return dataclasses.replace(
        plan, convert=convert, build=build, tied=True,
        config={**plan.config, "tie_word_embeddings": True},
        file_name=lambda key: named(key.removeprefix(QWEN3_PREFIX)),
    )  # fmt: skip
