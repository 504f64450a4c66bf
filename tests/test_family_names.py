"""Shared modules do not name model families: the modules that still do may only name fewer.

A family lives in its own package under library/models/families/ (flux/, sd/, sd3/, ...) and is
known to shared code through its entry in the family registry
(library/models/families/registry.py): shared code asks the registry which family claims a
model, owns a key or what to call it, so adding a family edits no shared module.

Shared modules are every module under library/ outside the family packages (the packages the
registry's entries load from), those in library/models/families/ itself included (the family
base classes, the registry, the shared loaders).

What counts as naming a family: one of the families' words (FAMILY_WORD: flux, kontext, klein,
krea, sd3, sdxl, SD and SD 1.x/2.x words such as sd1, "SD 2.x", SDFamily and StableDiffusion,
z-image, qwen-image and Qwen words that are no text encoder's (Qwen3, Qwen2.5-VL), chroma as the
family's name) at the start of a word, in any case, also after an underscore, in a module's
code: its identifiers and string literals (messages and config help are what users read).
sd-scripts, kohya's trainer, is no family. Every word of the registry's entries (names,
labels, model lines, variant names) and every family package's name must be such a word
(test_every_family_word_is_a_name). Comments and docstrings are prose and do not count. Module
names do not count either: a family-specific module outside the family packages would be
listed by what it says, not by its name.

ALLOWED lists the shared modules that still name a family, each with how many names (tokens)
and why. A module that starts naming one fails (ask the registry instead, or put the code in
the family's package); a listed module that names more fails; one that names fewer fails too,
so that its count is lowered (or the module removed from the list) and cannot grow back
unnoticed.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES_DIR = "library/models/families/"
# A family's word at the start of a word (not inside one: "influx", "reflux_rate"; "SD" also
# before a capitalised word: SDFamily). Qwen3, Qwen2.5-VL and Qwen3-VL are text encoders several
# families use; the lone lower-case "chroma" is the colour word (library/data/augment.py's hue
# shift), and "chroma" opening a string is the family's name.
FAMILY_WORD = re.compile(
    r"(?<![A-Za-z0-9])(?i:flux|kontext|klein|krea|sd3|sdxl|sd[-_ ]?v?[12]"
    r"|sd(?![a-z0-9]|[-_ ]scripts|_model_name)|stable[-_ ]?diffusion|z[-_]?image"
    r"|qwen(?![-_ .]?(?:[0-9]|vl))|wan(?![a-z0-9]|_vae|_2\.1_vae))"
    r"|(?<![A-Za-z0-9])SD(?=[A-Z][a-z])|Chroma|CHROMA|chroma_|_chroma|^[rbuf]*[\"']+chroma"
)
# Words of the families being added, before their registry entries exist.
NEW_FAMILY_WORDS = ("flux2", "FLUX.2", "klein", "Krea 2", "krea2")

_CONFIG_HELP = "config key descriptions (the generated docs/config.md) say what differs per family"
_SPEC = (
    "a family's single-file and folder loading facts, to become data of the family's spec "
    "(the loaders' own rework)"
)
ALLOWED = {
    "library/config/adapter_schema.py": (4, _CONFIG_HELP + " (SDXL's block-wise block counts)"),
    "library/config/dataset_schema.py": (1, _CONFIG_HELP + " (bucket steps)"),
    "library/config/flow_section.py": (
        8,
        "the shared flow-matching keys' help and the timestep_sampling values named after a "
        'family\'s schedule ("flux_shift", "qwen_shift"; families define their own [flow] '
        "keys in their packages)",
    ),
    "library/config/kohya_script_keys.py": (
        6,
        "why sd-scripts options are refused: flux_train.py's block-swap sliders, SD 1.x/SDXL "
        "inpainting, the full fine-tuning scripts a file was written for (sdxl_train.py, "
        "flux_train.py, sd3_train.py)",
    ),
    "library/config/musubi_args.py": (
        5,
        "musubi-tuner's words that name FLUX.1 and Qwen-Image (its timestep_sampling values "
        "qinglong_*, and the shared flux_shift / qwen_shift) in the messages that refuse them",
    ),
    "library/config/sampling_schema.py": (4, _CONFIG_HELP + " (default sampler and CFG)"),
    "library/config/model_schema.py": (9, _CONFIG_HELP + " (which SD versions are detected)"),
    "library/config/schema.py": (5, _CONFIG_HELP),
    "library/lora_tools/merge_into_model.py": (
        3,
        "--output's help describes each family's full-model file",
    ),
    "library/models/families/base.py": (
        2,
        "ModelFamily's defaults are SD's (its LABEL \"SD\"), and the block-wise options it "
        "refuses number SD's UNet blocks",
    ),
    "library/models/families/file_contents.py": (
        9,
        "what a file given in the wrong place holds, by FLUX.1's and SD3's key detectors",
    ),
    "library/models/families/file_plans.py": (2, _SPEC),
    "library/models/families/flow_options.py": (
        4,
        "the [model] settings of SD (v2, clip_skip, ...) a flow-matching family refuses or "
        "ignores, named as SD's in its messages",
    ),
    "library/models/families/registry.py": (
        34,
        "the one list of families: it imports each family's entry (and nothing else of it)",
    ),
    "library/models/families/transformer_keys.py": (
        12,
        "the CLIP-L and T5-XXL [flow] keys FLUX.1 and SD3 share: their help says where each "
        "family's files keep them",
    ),
    "library/models/original_names.py": (
        3,
        "the SGM (original SD) key layout's messages name the SD UNet and VAE they describe",
    ),
    "library/models/tokenizers.py": (
        7,
        "the Hugging Face repositories of SD 1.x/2.x/SDXL tokenizers, which a local copy of "
        "the CLIP tokenizer is found by",
    ),
    "library/models/text_encoders/t5.py": (
        3,
        "where T5-XXL's tokenizer is found beside single files: the FLUX.1 repositories whose "
        "tokenizer_2/ holds it, one definition for FLUX.1, Chroma and SD3 (each family package "
        "named them before)",
    ),
    "library/networks/kohya_names.py": (
        8,
        "kohya's text-encoder prefixes explained by the families whose files hold them "
        "(lora_te1/2: SDXL, lora_te3: FLUX.1's T5-XXL)",
    ),
    "library/training/flow_matching.py": (
        32,
        "kohya's and musubi-tuner's flow-matching schedules, FLUX.1's resolution-dependent "
        "shift (flux_shift) and Qwen-Image's (qwen_shift) among them",
    ),
    "library/training/objectives.py": (
        3,
        "the flow-matching objective follows kohya's FLUX.1 trainer (its label, flux_shift)",
    ),
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


@functools.cache
def _code_words(source: str) -> tuple[tuple[int, str], ...]:
    """(line, token) of each identifier and string literal of ``source`` but its docstrings.
    Cached: the tests scan every library module once per family word, and tokenizing is the cost."""
    docstrings = _docstring_starts(ast.parse(source))
    return tuple(
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.NAME
        or (token.type == tokenize.STRING and token.start not in docstrings)
    )


def family_names(source: str, word: re.Pattern = FAMILY_WORD) -> list[tuple[int, str]]:
    """(line, token) of each identifier or string literal of ``source`` naming a family (that
    ``word`` finds)."""
    return [(line, text) for line, text in _code_words(source) if word.search(text)]


def _family_packages() -> tuple[str, ...]:
    """The folders of the family packages: the packages the registry's entries load from."""
    from library.models.families import registry

    return tuple(
        dict.fromkeys(
            FAMILIES_DIR + entry.load.target.split(":")[0].split(".")[3] + "/"
            for entry in registry.families()
        )
    )


def _shared_modules() -> list[Path]:
    packages = _family_packages()
    return [
        path
        for path in sorted((ROOT / "library").rglob("*.py"))
        if not path.relative_to(ROOT).as_posix().startswith(packages)
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
    more = [
        f"{module}: {len(names)} names, {ALLOWED[module][0]} allowed (" + ", ".join(
            f"{line}: {text[:40]}" for line, text in names) + ")"
        for module, names in naming.items()
        if module in ALLOWED and len(names) > ALLOWED[module][0]
    ]  # fmt: skip
    assert not new and not more, (
        "shared modules name a model family; ask the family registry "
        "(library/models/families/registry.py) or move the code into the family's package:\n"
        + "\n".join(new + more)
    )
    fewer = sorted(
        f"{module}: {len(naming.get(module, ()))}"
        for module, (count, _) in ALLOWED.items()
        if len(naming.get(module, ())) < count
    )
    assert not fewer, (
        f"these modules name families less often: lower their counts in ALLOWED in "
        f"{Path(__file__).name} (remove those at 0): {', '.join(fewer)}"
    )


def _registry_words() -> set[str]:
    """Every word the registry has for a family: names, labels, model lines, variant names
    and labels, and the names of the family packages."""
    from library.models.families import registry

    words = {package.split("/")[-2] for package in _family_packages()}
    for entry in registry.families():
        words |= {entry.name, entry.label, entry.models, *entry.lines}
        words |= {*entry.tool.variant_labels, *entry.tool.variant_labels.values()}
    return words


def test_every_family_word_is_a_name():
    words = sorted(_registry_words() | set(NEW_FAMILY_WORDS))
    missed = [word for word in words if not family_names(f"x = {word!r}\n")]
    assert not missed, f"FAMILY_WORD misses these families' words; add them: {missed}"


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
    # Wan, not the Wan 2.1 VAE's file layout that Qwen-Image's and Krea 2's VAEs share
    # (models/wan_vae_keys.py, families/wan_vae_file.py)
    "wan": re.compile(r"(?<![a-z0-9])wan(?![a-z0-9]|_vae|_2\.1_vae)", re.IGNORECASE),
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
    named = (
        'x = (SDFamily, "SD 1.x", sd2, "Kontext", "Krea 2", flux2, "chroma", chroma_x, '
        '"qwen_shift", "Qwen-Image", StableDiffusionPipeline)\n'
    )
    assert len(family_names(named)) == 11
    others = (
        'x = ("sd-scripts", ss_sd_model_name, "Qwen3", "Qwen2.5-VL", qwen3_vl, chroma, '
        '"a chroma shift", SDPA, "klein_x"[1:], sd_scripts)\n'
    )
    assert [text for _, text in family_names(others)] == ['"klein_x"']
