"""Read a sample_prompts file (.txt, .toml or .json, kohya's formats) into resolved prompts.

Every prompt comes out complete: options the file leaves out take the [sampling] defaults, sizes
are rounded down to a multiple of 8 (at least 64) as kohya does, and a prompt without a seed gets
one derived from the base seed and its index, so every round starts from the same noise and the
images of different steps are comparable.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from library.config.sampling_schema import SamplingSection
from library.config.suggest import nearest
from library.data.images import read_image_header
from library.errors import ConfigError, DataError
from library.sampling.samplers import check_sampler
from library.user_files import read_user_text

SIZE_STEP = 8  # the VAE's downsampling factor; the pipeline needs sizes divisible by it
MIN_SIZE = 64
MAX_STEPS = 1000  # the noise schedule has 1000 training timesteps

# Per-line options of the .txt format -> the key the .toml/.json formats use (kohya's names).
OPTIONS = {
    "n": "negative_prompt",
    "w": "width",
    "h": "height",
    "d": "seed",
    "s": "sample_steps",
    "l": "scale",
    "ss": "sample_sampler",
    "g": "guidance_scale",
    # edit models: musubi-tuner's reference (control) image, repeated for several; and the
    # image the edit should give, shown beside the result
    "ci": "control_image",
    "ti": "target_image",
    # video models (musubi-tuner's words): the clip's frame count, and the image-to-video
    # models' first frame
    "f": "frame_count",
    "i": "image_path",
}
# Options a line may repeat: each adds to a list.
_REPEATED = {"control_image"}
_KEY_TYPES: dict[str, tuple[type, ...]] = {
    "prompt": (str,),
    "negative_prompt": (str,),
    "width": (int,),
    "height": (int,),
    "seed": (int,),
    "sample_steps": (int,),
    "scale": (int, float),
    "sample_sampler": (str,),
    "guidance_scale": (int, float),
    "control_image": (str, list),  # one path, or a list of paths
    "target_image": (str,),
    "frame_count": (int,),
    "image_path": (str,),
}
_UNSUPPORTED_OPTIONS = {"cn": "ControlNet sampling is not supported"}


@dataclass(frozen=True)
class SamplePrompt:
    """One resolved prompt; ``index`` is its position in the file (0-based, comments skipped)."""

    index: int
    prompt: str
    negative_prompt: str
    width: int
    height: int
    seed: int
    steps: int
    scale: float | None  # classifier-free guidance; None: the model's default (sampling/)
    sampler: str | None  # None: the model's default sampler
    # FLUX.1 dev's distilled guidance (kohya's --g); None: 3.5. Other models have none.
    guidance_scale: float | None = None
    # edit models: the reference images (resized and center-cropped to width x height) and
    # the image the edit should give, shown beside the result in the grid
    references: tuple[Path, ...] = ()
    target_image: Path | None = None
    # video models: the clip's frames (1: an image) and an image-to-video model's first frame
    frames: int = 1
    first_frame: Path | None = None


def derive_seed(base_seed: int, index: int) -> int:
    """A 32-bit seed for prompt ``index`` that depends only on (base_seed, index)."""
    digest = hashlib.sha256(f"difftune-sample:{base_seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def round_size(pixels: int) -> int:
    """Round down to a multiple of 8, at least 64 (kohya's rule for sample sizes)."""
    return max(MIN_SIZE, pixels - pixels % SIZE_STEP)


def load_prompts(path: str | Path, sampling: SamplingSection, seed: int) -> list[SamplePrompt]:
    """Parse and resolve the prompts file; ConfigError naming the file (and line) on any problem.

    ``seed`` is the run's seed, the base of derived seeds unless sampling.sample_seed is set.
    """
    path = Path(path)
    readers = {".txt": _read_txt, ".toml": _read_toml, ".json": _read_json}
    reader = readers.get(path.suffix.lower())
    if reader is None:
        raise ConfigError(f"sample_prompts {path}: use a .txt, .toml or .json file")
    text = read_user_text(path, "sample_prompts file")
    entries = reader(text, str(path))
    if not entries:
        raise ConfigError(f"sample_prompts {path} has no prompts")
    base = sampling.sample_seed if sampling.sample_seed is not None else seed
    folder = path.parent
    return [
        _resolve(i, raw, where, sampling, base, folder) for i, (raw, where) in enumerate(entries)
    ]


def parse_prompt_line(line: str, where: str) -> dict[str, object]:
    """``prompt --w 512 --n blurry ...`` -> kohya's prompt keys; ConfigError naming ``where``."""
    # The leading space lets a line that starts with an option parse as options, not prompt.
    prompt, *options = (" " + line).split(" --")
    raw: dict[str, object] = {"prompt": prompt.strip()}
    for option in options:
        match = re.fullmatch(r"(\S+)\s+(.*\S)", option.strip(), re.DOTALL)
        name = (match.group(1) if match else option.strip()).lower()
        if name in _UNSUPPORTED_OPTIONS:
            raise ConfigError(f"{where}: --{name} is not supported ({_UNSUPPORTED_OPTIONS[name]})")
        if name not in OPTIONS:
            guess = nearest(name, OPTIONS)
            hint = f'did you mean "--{guess}"?' if guess else "known: --" + " --".join(OPTIONS)
            raise ConfigError(f"{where}: unknown option --{name}; {hint}")
        if match is None:
            raise ConfigError(f"{where}: option --{name} has no value")
        key = OPTIONS[name]
        if key in _REPEATED:
            raw.setdefault(key, []).append(match.group(2))
            continue
        if key in raw:
            raise ConfigError(f"{where}: option --{name} is given twice")
        raw[key] = _option_value(name, key, match.group(2), where)
    return raw


def _option_value(name: str, key: str, text: str, where: str) -> object:
    if _KEY_TYPES[key] == (str,):
        return text
    try:
        return int(text) if _KEY_TYPES[key] == (int,) else float(text)
    except ValueError:
        kind = "a whole number" if _KEY_TYPES[key] == (int,) else "a number"
        raise ConfigError(f"{where}: --{name} {text!r} is not {kind}") from None


def _read_txt(text: str, path: str) -> list[tuple[dict, str]]:
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            where = f"sample_prompts {path}, line {number}"
            entries.append((parse_prompt_line(stripped, where), where))
    return entries


def _read_toml(text: str, path: str) -> list[tuple[dict, str]]:
    """kohya's layout: a [prompt] table of defaults holding [[prompt.subset]] entries."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"sample_prompts {path}: not valid TOML: {e}") from None
    table = data.get("prompt")
    subsets = table.get("subset") if isinstance(table, dict) else None
    if not isinstance(subsets, list) or not all(isinstance(s, dict) for s in subsets):
        raise ConfigError(
            f"sample_prompts {path}: expected a [prompt] table with [[prompt.subset]] entries"
        )
    extra = sorted(set(data) - {"prompt"})
    if extra:
        raise ConfigError(f'sample_prompts {path}: unknown table or key "{extra[0]}"')
    defaults = {k: v for k, v in table.items() if k != "subset"}
    _check_keys(defaults, f"sample_prompts {path}, [prompt]")
    # An entry's own keys win over the [prompt] defaults.
    return [
        ({**defaults, **subset}, f"sample_prompts {path}, [[prompt.subset]] {n}")
        for n, subset in enumerate(subsets, start=1)
    ]


def _read_json(text: str, path: str) -> list[tuple[dict, str]]:
    """A list whose items are prompt objects (kohya's keys) or .txt-style lines."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"sample_prompts {path}, line {e.lineno}: not valid JSON: {e.msg}"
        ) from None
    if not isinstance(data, list):
        raise ConfigError(f"sample_prompts {path}: expected a JSON list of prompts")
    entries = []
    for n, item in enumerate(data, start=1):
        where = f"sample_prompts {path}, entry {n}"
        if isinstance(item, str):
            entries.append((parse_prompt_line(item.strip(), where), where))
        elif isinstance(item, dict):
            entries.append((item, where))
        else:
            raise ConfigError(f"{where}: expected an object or a string")
    return entries


def _check_keys(raw: dict, where: str) -> None:
    for key, value in raw.items():
        if key not in _KEY_TYPES:
            guess = nearest(key, _KEY_TYPES)
            hint = f'did you mean "{guess}"?' if guess else "known: " + ", ".join(_KEY_TYPES)
            raise ConfigError(f'{where}: unknown key "{key}"; {hint}')
        if key in _REPEATED and isinstance(value, list):
            if not value or not all(isinstance(v, str) for v in value):
                raise ConfigError(f'{where}: "{key}" = {value!r} is not a list of paths')
        elif isinstance(value, bool) or not isinstance(value, _KEY_TYPES[key]):
            kind = {str: "a string", int: "a whole number"}.get(_KEY_TYPES[key][0], "a number")
            raise ConfigError(f'{where}: "{key}" = {value!r} is not {kind}')


def _image_path(text: str, folder: Path, where: str, option: str) -> Path:
    """A prompt's image: relative paths from the prompts file's folder, else from the current
    folder (musubi-tuner's); ConfigError when it is neither, or not an image."""
    path = Path(text.strip())
    candidates = [path] if path.is_absolute() else [folder / path, path]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        tried = " or ".join(str(c) for c in dict.fromkeys(candidates))
        raise ConfigError(f"{where}: --{option} {text}: no image at {tried}; fix the path")
    try:
        read_image_header(found)
    except DataError as error:
        raise ConfigError(f"{where}: --{option}: {error}") from None
    return found


def _prompt_images(raw: dict, where: str, folder: Path) -> dict:
    references = raw.get("control_image", ())
    references = [references] if isinstance(references, str) else references
    target = raw.get("target_image")
    first = raw.get("image_path")
    return {
        "references": tuple(_image_path(r, folder, where, "ci") for r in references),
        "target_image": None if target is None else _image_path(target, folder, where, "ti"),
        "first_frame": None if first is None else _image_path(first, folder, where, "i"),
    }


def _resolve(
    index: int, raw: dict, where: str, sampling: SamplingSection, base: int, folder: Path
):
    _check_keys(raw, where)
    prompt = raw.get("prompt", "")
    if not prompt.strip():
        raise ConfigError(f"{where}: the prompt is empty")
    for key in ("width", "height", "seed"):
        if raw.get(key, 0) < 0:
            raise ConfigError(f'{where}: "{key}" must not be negative')
    frames = raw.get("frame_count", 1)
    if frames < 1:
        raise ConfigError(f"{where}: the frame count --f {frames} must be at least 1")
    steps = raw.get("sample_steps", sampling.sample_steps)
    if not 1 <= steps <= MAX_STEPS:
        raise ConfigError(f"{where}: sample steps {steps} must be between 1 and {MAX_STEPS}")
    scale = raw.get("scale", sampling.sample_scale)
    if scale is not None and scale < 0:
        raise ConfigError(f"{where}: the guidance scale {scale} must not be negative")
    guidance = raw.get("guidance_scale")
    if guidance is not None and guidance < 0:
        raise ConfigError(f"{where}: the distilled guidance --g {guidance} must not be negative")
    sampler = raw.get("sample_sampler", sampling.sample_sampler)
    seed = raw.get("seed")
    return SamplePrompt(
        index=index,
        prompt=prompt.strip(),
        negative_prompt=raw.get("negative_prompt", ""),
        width=round_size(raw.get("width", sampling.sample_width)),
        height=round_size(raw.get("height", sampling.sample_height)),
        seed=seed if seed is not None else derive_seed(base, index),
        steps=steps,
        scale=None if scale is None else float(scale),
        sampler=None if sampler is None else check_sampler(sampler, where),
        guidance_scale=None if guidance is None else float(guidance),
        frames=frames,
        **_prompt_images(raw, where, folder),
    )
