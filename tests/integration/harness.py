"""Helpers for integration tests: tiny datasets, config files, and in-process training runs."""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image
from safetensors.torch import load_file

COLORS = [
    (220, 40, 40),
    (40, 200, 60),
    (50, 70, 230),
    (230, 210, 40),
    (150, 60, 200),
    (30, 200, 200),
]


def make_images(folder: Path, count: int, size: int = 64, captions: bool = True) -> Path:
    """Write ``count`` distinct images (a colored square on a gradient) with captions."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        img = Image.new("RGB", (size, size))
        for y in range(size):
            for x in range(size):
                img.putpixel((x, y), ((x * 4 + i * 30) % 256, (y * 4) % 256, (i * 50) % 256))
        c = COLORS[i % len(COLORS)]
        for y in range(size // 4, 3 * size // 4):
            for x in range(size // 4, 3 * size // 4):
                img.putpixel((x, y), c)
        img.save(folder / f"img{i:02d}.png")
        if captions:
            (folder / f"img{i:02d}.txt").write_text(
                f"a photo of shape number {i}", encoding="utf-8"
            )
    return folder


def write_config(
    path: Path, model_dir: Path, image_dir: Path, output_dir: Path, subset_keys=None, **keys
) -> Path:
    """A sectionless (flat) config: every key routes to its section by name. ``resolution``
    goes into the [[datasets]] table (default 64), ``subset_keys`` into its subset (one with a
    ``video_directory`` is a video subset: no image_dir)."""
    resolution = keys.pop("resolution", 64)
    values = {
        "pretrained_model_name_or_path": str(model_dir),
        "output_dir": str(output_dir),
        "output_name": "run",
        "learning_rate": 1e-3,
        "max_grad_norm": 0.0,
        "seed": 7,
        "network_dim": 4,
        "network_alpha": 2.0,
        **keys,
    }
    lines = flat_toml_lines(values)
    lines += [
        "",
        "[[datasets]]",
        f"resolution = {resolution!r}",
        f"batch_size = {values.get('train_batch_size', 1)}",
        "[[datasets.subsets]]",
        *([] if "video_directory" in (subset_keys or {}) else [f'image_dir = "{image_dir}"']),
        'class_tokens = "shape"',
        "num_repeats = 1",
        *flat_toml_lines(subset_keys or {}),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def flat_toml_lines(values: dict) -> list[str]:
    """``key = value`` TOML lines of plain keys (booleans, numbers, lists, the rest as strings)."""
    lines = []
    for key, value in values.items():
        if isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{key} = {value!r}")
        elif isinstance(value, list):
            lines.append(f"{key} = {value!r}".replace("'", '"'))
        else:
            lines.append(f'{key} = "{value}"')
    return lines


def assert_fuses_exactly(pipe, path: Path, module: str, layer: torch.nn.Module) -> None:
    """diffusers' ``pipe.load_lora_weights(path)`` then ``fuse_lora`` turns ``layer`` (the
    denoiser's Linear the file's ``module`` adapts) into base + alpha / r * up @ down of the
    file's factors."""
    saved = tensors(path)
    base = layer.weight.detach().clone()
    pipe.load_lora_weights(str(path))
    pipe.fuse_lora(components=["transformer"], lora_scale=1.0)
    down, up = saved[f"{module}.lora_down.weight"], saved[f"{module}.lora_up.weight"]
    expected = base + saved[f"{module}.alpha"].item() / down.shape[0] * (up.float() @ down.float())
    fused = getattr(layer, "base_layer", layer).weight.detach()
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-6, msg=module)


def reset_accelerate() -> None:
    """accelerate keeps process-wide singletons; reset them between in-process runs."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


def train(config: Path, *overrides: str) -> int:
    """Run the CLI in this process; return its exit code."""
    from library.cli import main

    reset_accelerate()
    try:
        return main(["--config", str(config), *overrides])
    finally:
        reset_accelerate()


def tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def assert_close_dicts(a: dict, b: dict, atol: float, rtol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    worst = max((x - b[k]).abs().max().item() for k, x in a.items())
    for key in a:
        assert torch.allclose(a[key], b[key], atol=atol, rtol=rtol), f"{key}: worst diff {worst}"


def check_accumulation_and_resume(
    tmp_path: Path, make_config, common: dict, monkeypatch,
    files: tuple[str, ...] = ("run.safetensors",), atol: tuple[float, float] = (2e-6, 1e-6),
) -> None:  # fmt: skip
    """The same LoRA from 4 samples per step as one batch of 4, as 2 x 2 accumulated, and from
    a run stopped right after its step-1 save and resumed. ``make_config(folder, out, **keys)``
    writes a config of the model under test into ``folder``; ``common`` holds the step count and
    a batch of 4; ``files``: the files compared, within ``atol`` (accumulated, resumed)."""
    from library.training.saver import Saver

    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    one = tmp_path / "one"
    assert train(make_config(tmp_path / "a", one, **common)) == 0
    acc = tmp_path / "acc"
    layout = {**common, "train_batch_size": 2, "gradient_accumulation_steps": 2}
    assert train(make_config(tmp_path / "b", acc, **layout)) == 0
    for file in files:
        assert_close_dicts(tensors(acc / file), tensors(one / file), atol[0])

    resumed = tmp_path / "resumed"
    first = make_config(tmp_path / "c", resumed, save_every_n_steps=1, save_state=True, **common)
    original = Saver.after_step

    def stop_after_step_1(self, global_step):
        original(self, global_step)
        if global_step == 1:
            raise KeyboardInterrupt  # stopped right after its step-1 save

    monkeypatch.setattr(Saver, "after_step", stop_after_step_1)
    assert train(first) == 130
    monkeypatch.setattr(Saver, "after_step", original)
    assert train(first, "--resume", str(resumed / "run-step00000001-state")) == 0
    for file in files:
        assert_close_dicts(tensors(resumed / file), tensors(one / file), atol[1])


def check_folder_lora_resumes(
    tmp_path: Path, model_dir: Path, images: Path, run: dict, monkeypatch, subset_keys=None
) -> None:
    """check_accumulation_and_resume for a LoRA of the model folder ``model_dir`` on
    ``images`` (four of them): 2 steps of 4 samples, the config keys ``run`` over
    write_config's, ``subset_keys`` into its subset."""

    def make_config(where, out, **keys):
        return write_config(where / "c.toml", model_dir, images, out, subset_keys=subset_keys,
                            **{**run, **keys})  # fmt: skip

    common = {"max_train_steps": 2, "train_batch_size": 4}
    check_accumulation_and_resume(tmp_path, make_config, common, monkeypatch)


def captioned_images(folder: Path, captions) -> Path:
    """One 64-pixel image per caption in ``folder``, each with its caption file."""
    make_images(folder, len(captions), size=64)
    for caption, image in zip(captions, sorted(folder.glob("*.png")), strict=True):
        image.with_suffix(".txt").write_text(caption, encoding="utf-8")
    return folder


def mirrored_references(images: Path, folder: Path) -> Path:
    """Each image of ``images`` mirrored, under its own name in ``folder`` (an edit model's
    reference images, paired by control_directory)."""
    from PIL import Image

    folder.mkdir()
    for target in sorted(images.glob("*.png")):
        with Image.open(target) as image:
            image.transpose(0).save(folder / target.name)
    return folder
