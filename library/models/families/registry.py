"""The registered model families, and the questions shared code asks about them.

FAMILIES is the one list of families difftune trains, in the order messages list them; each
entry (library.models.families.family_entry) is defined beside its family. Rather than name
families, shared modules ask this module which family claims a model, owns a [flow] key or a
kohya network_module, or what to call it (tests/test_family_names.py lists the shared modules
that still name one). Those modules sit above the families: the code a family builds on does
not import this module, since the entries here name the family's code; it is handed what it
needs (the composed [flow] section's ``readers``, a UNet's key layout). A new family adds its
package and one line to FAMILIES.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from library.config.adapter_schema import LYCORIS_MODULE
from library.config.section import Section
from library.models.families.chroma.entry import CHROMA
from library.models.families.family_entry import GENERIC_LORA_MODULE, FamilyEntry, LoadedFamily
from library.models.families.flux.entry import FLUX
from library.models.families.flux2.entry import FLUX2
from library.models.families.kontext.entry import KONTEXT
from library.models.families.krea2.entry import KREA2
from library.models.families.qwenimage.entry import QWENIMAGE
from library.models.families.qwenimage_edit.entry import QWENIMAGE_EDIT, QWENIMAGE_EDIT_PLUS
from library.models.families.sd.entry import SD
from library.models.families.sd3.entry import SD3
from library.models.families.wan.entry import WAN
from library.models.families.zimage.entry import ZIMAGE

FAMILIES: tuple[FamilyEntry, ...] = (
    SD,
    FLUX,
    KONTEXT,
    FLUX2,
    SD3,
    ZIMAGE,
    CHROMA,
    QWENIMAGE,
    QWENIMAGE_EDIT,
    QWENIMAGE_EDIT_PLUS,
    KREA2,
    WAN,
)
_TEST_ENTRIES: list[FamilyEntry] = []


def families() -> tuple[FamilyEntry, ...]:
    """Every registered family, in the order messages list them."""
    return (*FAMILIES, *_TEST_ENTRIES)


@contextlib.contextmanager
def registered(entry: FamilyEntry) -> Iterator[FamilyEntry]:
    """For tests: ``entry`` is registered, after FAMILIES, inside the block. What modules build
    from the registry as they are imported (the network_module values the config schema takes,
    kohya's option tables, lora_tool's options and help) keeps to FAMILIES."""
    _TEST_ENTRIES.append(entry)
    try:
        yield entry
    finally:
        _TEST_ENTRIES.remove(entry)


def claim_order() -> tuple[FamilyEntry, ...]:
    """The families in the order they are asked whether they read a model (or a LoRA file):
    those whose models are a kind of another family's (``claims_within``: their claim is the
    narrower one), then the others, then the one whose claim is asked last (``claimed_last``).
    LoRA files are told apart in the same order."""
    return tuple(
        sorted(families(), key=lambda entry: (entry.claimed_last, entry.claims_within is None))
    )


def family_entry(name: str) -> FamilyEntry:
    """The family named ``name`` ("flux")."""
    return next(entry for entry in families() if entry.name == name)


def entry_of(family: LoadedFamily) -> FamilyEntry:
    """The registered family a loaded family (a ModelFamily instance) was built from: its edit
    variant's entry, else the entry without an edit variant whose class it is."""
    edit = getattr(family, "edit", None)
    if edit is not None:
        return family_entry(edit.entry)
    # no family's class derives from another's (tests/test_family_classes.py): one match
    found = (e for e in families() if e.edit is None and isinstance(family, e.family()))
    entry = next(found, None)
    if entry is None:
        raise LookupError(f"{family.name} is no registered family")
    return entry


def network_module_owner(module: str | None) -> FamilyEntry | None:
    """The family whose own kohya network module ``module`` is; None for one every family
    takes (networks.lora, lycoris.kohya) or none does."""
    if module in (GENERIC_LORA_MODULE, LYCORIS_MODULE):
        return None
    return next((entry for entry in families() if entry.network_module == module), None)


def network_modules() -> tuple[str, ...]:
    """Every kohya network_module a config may name: kohya's LoRA, each family's own, LyCORIS."""
    own = (entry.network_module for entry in families())
    return tuple(dict.fromkeys((GENERIC_LORA_MODULE, *own, LYCORIS_MODULE)))


def flow_key_owners(key: str) -> tuple[FamilyEntry, ...]:
    """The families that read the [flow] key ``key``."""
    return tuple(entry for entry in families() if key in entry.flow_keys)


def draw_owner(value: str | None) -> FamilyEntry | None:
    """The family whose own timestep_sampling value ``value`` is (its entry's
    ``timestep_draws``); None for a shared draw or None."""
    return next((entry for entry in families() if value in entry.timestep_draws), None)


def component_file_keys() -> tuple[str, ...]:
    """The [flow] keys of the component files and folders a family's single files may need
    (its entry's ``tool.component_options``), each once, in registry order."""
    return tuple(dict.fromkeys(key for entry in families() for key in entry.tool.component_options))


def foreign_flow_key(flow: Section, name: str) -> tuple[str, tuple[FamilyEntry, ...]] | None:
    """(the first set [flow] key the family ``name`` does not read, the families that read it);
    None when it reads every set key. ``flow``: the [flow] section (config.flow_schema composes
    it from this registry)."""
    for key in type(flow).model_fields:
        if getattr(flow, key) is not None and key not in family_entry(name).flow_keys:
            return key, flow_key_owners(key)
    return None


def unet_key_layout(unet_config) -> str:
    """How kohya's files name the modules of a UNet with this config: "original" when a
    family's entry says so of it (SDXL's SGM layout), else "diffusers" (for
    networks.kohya_names.kohya_path, from the modules above the families)."""
    layouts = (entry.lora_files.unet_key_layout for entry in families())
    found = (layout(unet_config) for layout in layouts if layout is not None)
    return "original" if "original" in found else "diffusers"


def text_prefix_line(prefixes: tuple[str, ...]) -> str | None:
    """The model line whose LoRA files name their text encoders with exactly ``prefixes``
    (kohya's: ("lora_te1", "lora_te2") is SDXL's); None for no line."""
    return next(
        (
            line
            for entry in families()
            for own, line in entry.lora_files.text_prefixes.items()
            if own == tuple(prefixes)
        ),
        None,
    )


def text_prefix_lines(prefix: str) -> list[str]:
    """The model lines whose LoRA files use the text-encoder prefix ``prefix``."""
    return [
        line
        for entry in families()
        for own, line in entry.lora_files.text_prefixes.items()
        if prefix in own
    ]


def listed(words: list[str] | tuple[str, ...], last: str = "and") -> str:
    """ "A, B and C" (``last`` joins the last two)."""
    return f" {last} ".join(filter(None, (", ".join(words[:-1]), words[-1])))


def trained_lines(last: str = "and") -> str:
    """The model lines difftune trains, in words: "SD 1.x/2.x, SDXL, FLUX.1 and SD3/SD3.5"."""
    return listed([line for entry in families() for line in entry.lines], last)
