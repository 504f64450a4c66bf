"""Peak host memory of one full-model save, measured in a fresh process.

python tests/saving/save_memory_probe.py FOLDER

Builds a FLUX.1 transformer of about 70 million parameters (float32, 280 MB) without a memory
spike (on the meta device, then filled in place) and saves it in bfloat16 twice: first with
difftune's writer (library.saving.streamed) as FOLDER/streamed.safetensors, then as a plain save
does (the whole model cast first, then safetensors' save_file) as FOLDER/eager.safetensors. The
process's peak memory only grows, so the streamed save is measured first. Prints, as JSON, the
model's bytes and for each save the resident memory before it and the peak after it.
"""

from __future__ import annotations

import gc
import json
import resource
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as file:
        return int(file.read().split()[1]) * resource.getpagesize()


def _peak() -> int:
    # VmHWM, the peak of this process image: getrusage's ru_maxrss survives execve, so a probe
    # started from a large parent (a long pytest session) would report the parent's size
    with open("/proc/self/status", encoding="ascii") as file:
        for line in file:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def _model():
    from diffusers import FluxTransformer2DModel

    from tests.kits.flux.tiny_shapes import tiny_transformer_config

    config = {
        **tiny_transformer_config("dev"),
        "num_layers": 4,
        "num_single_layers": 8,
        "attention_head_dim": 64,
        "num_attention_heads": 8,
        "axes_dims_rope": (8, 28, 28),
    }
    with torch.device("meta"):
        model = FluxTransformer2DModel(**config)
    model = model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.normal_()
    return model


def _eager(path: Path, model) -> None:
    from safetensors.torch import save_file

    from library.models.families.flux.original_keys import transformer_to_original

    state = {k: v.detach().to("cpu", torch.bfloat16) for k, v in model.state_dict().items()}
    tensors = {k: v.contiguous() for k, v in transformer_to_original(state).items()}
    save_file(tensors, str(path))


def main() -> None:
    from library.config.flow_schema import FlowSection
    from library.models.families.flux.family import flux_family

    folder = Path(sys.argv[1])
    model = _model()
    gc.collect()
    found: dict[str, object] = {
        "model": sum(t.numel() * t.element_size() for t in model.state_dict().values()),
        "peak_built": _peak(),
    }
    family = flux_family("dev", FlowSection())
    for mode in ("streamed", "eager"):
        gc.collect()
        before = _rss()
        path = folder / f"{mode}.safetensors"
        if mode == "streamed":
            family.write_full_model(path, model, None, {}, torch.bfloat16)
        else:
            _eager(path, model)
        found[mode] = {"rss": before, "peak": _peak()}
    print(json.dumps(found))


if __name__ == "__main__":
    main()
