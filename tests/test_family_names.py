"""Shared modules do not name model families: the modules that still do may only get fewer.

A family lives in its own package under library/models/families/ (flux/, sd/, sd3/, ...) and is
known to shared code through its entry in the family registry
(library/models/families/registry.py): shared code asks the registry which family claims a
model, owns a key or what to call it, so adding a family edits no shared module.

What counts as naming a family: a word starting with flux, sd3, sdxl, zimage or qwenimage (any
case, also after an underscore, z_image, z-image, qwen_image and qwen-image too: ``FluxTransformer2DModel``, ``networks.lora_sd3``,
``"SDXL"``) in a module's code, that is its identifiers and string literals (messages and config help are what users read).
Comments and docstrings are prose and do not count. Module names do not count either: a
family-specific module outside the family packages would be listed by what it says, not by its
name.

ALLOWED lists the library modules outside the family packages that still name a family, each
with why. A module that starts naming one fails (ask the registry instead, or put the code in
the family's package); a listed module that no longer names one fails too, so that it is
removed from the list and cannot start again unnoticed.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILY_PACKAGES = ("library/models/families/",)
FAMILY_WORD = re.compile(r"(?<![a-z0-9])(flux|sd3|sdxl|z_?-?image|qwen_?-?image)", re.IGNORECASE)

_CONFIG_HELP = "config key descriptions (the generated docs/config.md) say what differs per family"
ALLOWED = {
    "library/config/adapter_schema.py": _CONFIG_HELP + " (SDXL's block-wise block counts)",
    "library/config/dataset_schema.py": _CONFIG_HELP + " (bucket steps)",
    "library/config/flow_schema.py": "the shared flow-matching keys' help and kohya's "
    'timestep_sampling value "flux_shift" (families define their own [flow] keys in their '
    "packages)",
    "library/config/kohya_script_keys.py": "why sd-scripts options are refused: flux_train.py's "
    "block-swap sliders, SD 1.x/SDXL inpainting, the full fine-tuning scripts a file was "
    "written for (sdxl_train.py, flux_train.py, sd3_train.py)",
    "library/config/musubi_args.py": "musubi-tuner's words that name FLUX.1 and FLUX.2 (its "
    "timestep_sampling values flux2_shift, the network module networks.lora_flux_2) in the "
    "messages that refuse them",
    "library/config/sampling_schema.py": _CONFIG_HELP + " (default sampler and CFG)",
    "library/config/schema.py": _CONFIG_HELP,
    "library/lora_tools/merge_into_model.py": "--output's help describes each family's "
    "full-model file",
    "library/networks/kohya_names.py": "kohya's text-encoder prefixes explained by the families "
    "whose files hold them (lora_te1/2: SDXL, lora_te3: FLUX.1's T5-XXL)",
    "library/training/flow_matching.py": "kohya's flow-matching schedules, Flux.1's "
    "resolution-dependent shift (flux_shift) among them",
    "library/training/objectives.py": "the flow-matching objective follows kohya's Flux.1 "
    "trainer (its label and flux_shift)",
}


def _docstring_starts(tree: ast.AST) -> set[tuple[int, int]]:
    """Where each module, class and function docstring starts (line, column)."""
    starts = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                starts.add((first.lineno, first.col_offset))
    return starts


def family_names(source: str, word: re.Pattern = FAMILY_WORD) -> list[tuple[int, str]]:
    """(line, token) of each identifier or string literal of ``source`` naming a family (that
    ``word`` finds)."""
    docstrings = _docstring_starts(ast.parse(source))
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.STRING and token.start in docstrings:
            continue
        if token.type in (tokenize.NAME, tokenize.STRING) and word.search(token.string):
            found.append((token.start[0], token.string))
    return found


def _shared_modules() -> list[Path]:
    return [
        path
        for path in sorted((ROOT / "library").rglob("*.py"))
        if not path.relative_to(ROOT).as_posix().startswith(FAMILY_PACKAGES)
    ]


def test_only_listed_shared_modules_name_a_family():
    naming = {}
    for path in _shared_modules():
        names = family_names(path.read_text(encoding="utf-8"))
        if names:
            naming[path.relative_to(ROOT).as_posix()] = names
    new = [
        f"{module}:{line}: {text[:60]}"
        for module, names in naming.items()
        if module not in ALLOWED
        for line, text in names[:3]
    ]
    assert not new, (
        "shared modules name a model family; ask the family registry "
        "(library/models/families/registry.py) or move the code into the family's package:\n"
        + "\n".join(new)
    )
    cleared = sorted(set(ALLOWED) - set(naming))
    assert not cleared, (
        f"these modules no longer name a family: remove them from ALLOWED in {Path(__file__).name}"
        f": {', '.join(cleared)}"
    )


# Families added once the registry existed: each is its package plus its line in the registry,
# so no other module names it, shared or another family's (its own package's name aside).
PACKAGE_ONLY = {
    "zimage": re.compile(r"(?<![a-z0-9])z_?-?image", re.IGNORECASE),
    # "Chroma"/"CHROMA" in names and messages, chroma_/_chroma in names, "chroma" opening a
    # string (the family's name); the lone lower-case identifier is the colour word
    # (library/data/augment.py's hue shift)
    "chroma": re.compile(r"Chroma|CHROMA|chroma_|_chroma|^[rbuf]*[\"']+chroma"),
    # Qwen-Image, not Qwen3 or Qwen2.5-VL (the text encoders of other families too), nor the
    # Qwen-Image VAE that sd-scripts' Anima options name (library/config/kohya_script_keys.py)
    "qwenimage": re.compile(r"(?<![a-z0-9])qwen_?-?image(?![ _-]?vae)", re.IGNORECASE),
}
REGISTRY = "library/models/families/registry.py"


def _packages_within(family: str) -> tuple[str, ...]:
    """The packages of the families built within ``family`` (their entries' claims_within: an
    edit model on its text-to-image model's modules), which may name it."""
    from library.models.families import registry

    return tuple(
        dict.fromkeys(
            "library/models/families/" + entry.load.target.split(":")[0].split(".")[3] + "/"
            for entry in registry.families()
            if entry.claims_within == family
        )
    )


def test_a_new_family_is_its_package_and_one_registry_line():
    for family, word in PACKAGE_ONLY.items():
        own = (f"library/models/families/{family}/", *_packages_within(family))
        naming = {}
        for path in sorted((ROOT / "library").rglob("*.py")):
            module = path.relative_to(ROOT).as_posix()
            if module.startswith(own):
                continue
            found = family_names(path.read_text(encoding="utf-8"), word)
            if found:
                naming[module] = found
        registry_lines = naming.pop(REGISTRY, [])
        assert not naming, f"modules outside {own[0]} name {family}: " + ", ".join(
            f"{module}:{line}" for module, found in naming.items() for line, _ in found
        )
        # the imports of its entry (and of the families within it) and their lines in FAMILIES
        source = (ROOT / REGISTRY).read_text(encoding="utf-8").splitlines()
        lines = {source[line - 1].strip() for line, _ in registry_lines}
        imports = {line for line in lines if line.startswith("from library.models.families.")}
        assert imports and all(line.endswith(",") for line in lines - imports), lines


def test_comments_docstrings_and_other_words_are_not_names():
    source = (
        '"""FLUX.1 docs."""\n'
        "# an SD3 comment\n"
        "def f():\n"
        '    """SDXL docs."""\n'
        '    return "influx", reflux_rate, "sd3.5-large"\n'
    )
    assert family_names(source) == [(5, '"sd3.5-large"')]
    assert [text for _, text in family_names('x = is_sdxl or "FLUX.1"\n')] == [
        "is_sdxl",
        '"FLUX.1"',
    ]
