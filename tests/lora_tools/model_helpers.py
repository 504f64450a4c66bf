"""Tiny base models on disk and LoRAs trained-as-if by difftune's own adapters, for the tests of
the toolbox commands that need a model (merge, extract, convert, check).

Models are written once per test process (``model_dir``) and shared by every test file. A LoRA
is made the way the trainer makes one: peft adapters injected with the family's default targets
(library.networks.lora.apply_lora), filled with noise and written with ``family.lora_tensors``.
Its weight change is then read off the adapters themselves (``scaling * B @ A`` per adapted
diffusers layer), independently of the toolbox's name tables.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch

ASSETS = Path(__file__).resolve().parents[1] / "assets"
# the toolbox's family word -> its kit's (name, variant)
KITS = {"sd1": ("sd", "sd1"), "sdxl": ("sd", "sdxl"), "flux": ("flux", "dev"),
        "sd3": ("sd3", "sd3.5-medium")}  # fmt: skip


def model_dir(family: str, kit_folders) -> Path:
    """A tiny model of ``family`` ("sd1", "sdxl", "flux", "sd3") as a diffusers folder: the
    session's kit folder (the ``kit_folders`` fixture), shared with the other suites."""
    return kit_folders(*KITS[family])


def load(path, **options):
    """Components of the model at ``path`` through the toolbox's loader (fp32)."""
    from library.lora_tools.base_model import COMPONENT_OPTIONS, load_model

    args = argparse.Namespace(precision="fp32", **dict.fromkeys(COMPONENT_OPTIONS))
    for key, value in options.items():
        setattr(args, key, value)
    return load_model(args, str(path))


def run_tool(*argv) -> int:
    """``lora_tool.py argv`` through library.lora_tools.cli.main; the exit code. Commands whose
    module cannot be imported (others are written in parallel) are left out of the parser."""
    import importlib

    from library.lora_tools import cli

    present = {}
    for command, module in cli.COMMANDS.items():
        try:
            importlib.import_module(f"library.lora_tools.{module}")
        except Exception:  # noqa: BLE001 - a command being written elsewhere
            continue
        present[command] = module
    saved, cli.COMMANDS = cli.COMMANDS, present
    try:
        return cli.main([str(a) for a in argv])
    finally:
        cli.COMMANDS = saved


class TrainedLora:
    """A LoRA made by difftune's adapters on a copy of a model.

    ``tensors``: the file's tensors (``family.lora_tensors``); ``deltas``: (model role, diffusers
    path) -> the weight change ``alpha / r * up @ down`` of that layer, in the layer's weight
    shape, computed here from the adapters' own weights.
    """

    def __init__(self, components, rank=4, alpha=2.0, conv=None, text=True, seed=0, std=0.1):
        from library.networks.kohya_names import UNET
        from library.networks.lora import LoraSpec, apply_lora, lora_layers, randomize_lora

        family = components.family
        conv_rank, conv_alpha = conv if conv else (None, None)
        spec = LoraSpec(rank, alpha, conv_rank, conv_alpha)
        self.models: dict[str, torch.nn.Module] = {}
        denoiser = copy.deepcopy(components.denoiser)
        apply_lora(denoiser, family.adapter_targets(denoiser, "unet", conv is not None), spec)
        self.models[UNET] = denoiser
        self.roles = {UNET: "denoiser"}
        if text:
            prefixes = family.text_encoder_lora_prefixes
            for index, encoder in enumerate(components.text_encoders):
                if not family.trains_text_encoder(index):
                    continue
                encoder = copy.deepcopy(encoder)
                apply_lora(encoder, family.adapter_targets(encoder, "text_encoder", False), spec)
                self.models[prefixes[index]] = encoder
                self.roles[prefixes[index]] = index
        generator = torch.Generator().manual_seed(seed)
        for model in self.models.values():
            randomize_lora(model, generator, std=std)
        self.tensors = family.lora_tensors(self.models)
        self.deltas = {}
        for prefix, model in self.models.items():
            for path, layer in lora_layers(model).items():
                self.deltas[(self.roles[prefix], path)] = peft_delta(layer)

    def save(self, path: Path, metadata: dict | None = None) -> Path:
        from library.saving.lora_file import save_lora_file

        save_lora_file(path, self.tensors, metadata or {}, torch.float32)
        return path


def peft_delta(layer) -> torch.Tensor:
    """``scaling * B @ A`` of a peft LoRA layer, by hand, in the base weight's shape."""
    from library.networks.lora import ADAPTER

    down = layer.lora_A[ADAPTER].weight.detach().double()
    up = layer.lora_B[ADAPTER].weight.detach().double()
    scale = float(layer.scaling[ADAPTER])
    weight = layer.base_layer.weight
    if down.dim() == 2:
        return (scale * up @ down).reshape(weight.shape)
    # conv: down [r, in, kh, kw] holds the kernel, up [out, r, 1, 1] mixes its channels
    return scale * torch.einsum("or,rikl->oikl", up[:, :, 0, 0], down)


def module_of(components, role, path: str) -> torch.nn.Module:
    """The layer at ``path`` of the denoiser (role "denoiser") or text encoder ``role``."""
    model = components.denoiser if role == "denoiser" else components.text_encoders[role]
    return model.get_submodule(path)


def kohya_deltas(tensors, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """kohya module name -> ``scale * alpha / r * up @ down`` as a float64 [out, in*k*k] matrix."""
    names = sorted({k.split(".", 1)[0] for k in tensors if k.endswith(".lora_down.weight")})
    out = {}
    for name in names:
        down = tensors[f"{name}.lora_down.weight"].double()
        up = tensors[f"{name}.lora_up.weight"].double()
        rank = down.shape[0]
        alpha = float(tensors[f"{name}.alpha"]) if f"{name}.alpha" in tensors else rank
        out[name] = scale * alpha / rank * (up.reshape(up.shape[0], -1) @ down.reshape(rank, -1))
    return out


def read(path) -> tuple[dict, dict]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        return {k: handle.get_tensor(k) for k in handle.keys()}, dict(handle.metadata() or {})  # noqa: SIM118


def error_lines(err: str) -> list[str]:
    return [line for line in err.strip().splitlines() if line.startswith("error:")]
