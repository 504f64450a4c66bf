"""The family registry: its entries agree with the families, and a family added to it is known
everywhere shared code asks which family (config checks, network_module, [flow] keys, LoRA
file checks, lora_tool's labels) with no shared module edited."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from library.config import flow_schema
from library.config.flow_schema import FlowSection, ModelVersionKeys
from library.config.flow_section import FlowMatchingKeys
from library.config.schema import ModelSection, NetworkSection
from library.config.section import Section
from library.errors import CheckpointError, ConfigError, ModelError
from library.lora_tools.base_model import family_group, family_label, guess_family, other_family
from library.models.families import registry
from library.models.families.base import ModelFamily
from library.models.families.chroma.entry import CHROMA
from library.models.families.chroma.family import chroma_family
from library.models.families.family_choice import (
    check_config_family,
    check_network_module,
    entry_for,
)
from library.models.families.family_entry import FamilyEntry, LoraFiles, ToolFacts
from library.models.families.flux import family as flux
from library.models.families.flux.entry import FLUX
from library.models.families.flux2.entry import FLUX2
from library.models.families.flux2.family import flux2_family
from library.models.families.kontext.entry import KONTEXT
from library.models.families.kontext.family import kontext_family
from library.models.families.krea2.entry import KREA2
from library.models.families.krea2.family import krea2_family
from library.models.families.qwenimage.entry import QWENIMAGE
from library.models.families.qwenimage.family import qwenimage_family
from library.models.families.qwenimage_edit.entry import QWENIMAGE_EDIT, QWENIMAGE_EDIT_PLUS
from library.models.families.qwenimage_edit.family import qwenimage_edit_family
from library.models.families.sd import family as sd
from library.models.families.sd.entry import SD
from library.models.families.sd3 import family as sd3
from library.models.families.sd3.entry import SD3
from library.models.families.wan.entry import WAN
from library.models.families.wan.family import WAN as WAN_FAMILY
from library.models.families.zimage.entry import ZIMAGE
from library.models.families.zimage.family import zimage_family
from library.networks.lora_file_checks import check_lora_file, lora_family

_INSTANCES = [
    value
    for module in (sd, flux, sd3)
    for value in vars(module).values()
    if isinstance(value, ModelFamily)
] + [zimage_family(variant, shift) for variant, shift in (("turbo", 3.0), ("base", 6.0))]
_INSTANCES.append(chroma_family(FlowSection()))
_INSTANCES.append(qwenimage_family())
_INSTANCES += [
    flux2_family(*m) for m in (("klein", "4b", False), ("klein", "9b", True), ("dev", "32b", False))
]
_INSTANCES.append(kontext_family(FlowSection()))
_INSTANCES.append(qwenimage_edit_family())
_INSTANCES.append(qwenimage_edit_family(plus=True))
_INSTANCES.append(krea2_family())
_INSTANCES.append(WAN_FAMILY)


@dataclass(frozen=True, kw_only=True)
class FakeFamily(ModelFamily):
    LABEL: ClassVar[str] = "Fake"


FAKE_MODEL = FakeFamily(
    name="fake-a",
    prediction_type="flow",
    base_model_version="fake_v1",
    modelspec_architecture="fake-1",
    default_resolution=64,
    network_modules=("networks.lora", "networks.lora_fake"),
)
FAKE = FamilyEntry(
    name="fake",
    label="Fake",
    models="FAKE-1",
    lines=("FAKE-1",),
    family=lambda: FakeFamily,
    claims=lambda model, flow: model.pretrained_model_name_or_path.endswith("fake-model"),
    load=lambda *args: pytest.fail("nothing loads a fake model"),
    network_module="networks.lora_fake",
    flow_matching=True,
    flow_keys=frozenset({"t5xxl", "ae"}),
    lora_files=LoraFiles(
        denoiser_marks=(("lora_unet_fake_blocks_", "FAKE-1"),),
        text_prefixes={("lora_te1", "lora_te9"): "FAKE-1"},
        architectures=(("fake-1", "FAKE-1"),),
    ),
    tool=ToolFacts(
        variant_labels={"fake-a": "FAKE-1 a"},
        lora_marks=(("lora_unet_fake_blocks_", "FAKE-1"),),
        version_marks=(("fake", "FAKE-1"),),
    ),
)
MODEL = ModelSection(pretrained_model_name_or_path="/models/fake-model")


def test_every_family_instance_agrees_with_its_entry():
    assert registry.FAMILIES == (
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
    names = {registry.entry_of(family).name for family in _INSTANCES}
    assert names == {
        "sd",
        "flux",
        "flux_kontext",
        "sd3",
        "zimage",
        "chroma",
        "flux2",
        "qwenimage",
        "qwenimage_edit",
        "qwenimage_edit_plus",
        "krea2",
        "wan",
    }
    for family in _INSTANCES:
        entry = registry.entry_of(family)
        assert family.name in entry.tool.variant_labels
        assert family.network_modules[-1] == entry.network_module  # the one suggested
        assert entry.label == family.label
        assert getattr(family, "flow_kind", entry.name) == entry.name
        assert (family.prediction_type == "flow") == entry.flow_matching
        # a family within another's (FLUX.1 Kontext) shares its LoRA files' line
        within = registry.family_entry(entry.claims_within) if entry.claims_within else entry
        assert family_group(family) in within.lines


def test_every_flow_key_is_read_by_a_family_and_schema_values_come_from_the_registry():
    assert [key for key in FlowSection.model_fields if not registry.flow_key_owners(key)] == []
    annotation = NetworkSection.model_fields["network_module"].annotation
    assert typing.get_args(annotation) == registry.network_modules()
    assert registry.network_modules() == (
        "networks.lora",
        "networks.lora_flux",
        "networks.lora_flux_2",
        "networks.lora_sd3",
        "networks.lora_zimage",
        "networks.lora_qwen_image",
        "networks.lora_krea2",
        "networks.lora_wan",
        "lycoris.kohya",
    )
    lines = (
        "SD 1.x/2.x, SDXL, FLUX.1, FLUX.1 Kontext, FLUX.2, SD3/SD3.5, Z-Image, Chroma, Qwen-Image, "
        "Qwen-Image-Edit, Qwen-Image-Edit-2509/2511, Krea 2 and Wan"
    )
    assert registry.trained_lines() == lines


def test_flow_keys_come_from_the_families_that_define_them():
    """Each [flow] key is a field of the shared keys (the draw, model_version) or of exactly one class a
    family names in config_keys; a family reads every key it defines, and every key it reads
    is a field of the section (a key read but not defined would be refused as unknown)."""
    defined = {}
    for entry in registry.FAMILIES:
        for keys in entry.config_keys:
            assert set(keys.model_fields) <= entry.flow_keys, (entry.name, keys.__name__)
            for name in keys.model_fields:
                assert defined.setdefault(name, keys) is keys, name
        assert entry.flow_keys <= set(FlowSection.model_fields), entry.name
    shared = set(FlowSection.model_fields) - set(defined)
    assert shared == set(FlowMatchingKeys.model_fields) | set(ModelVersionKeys.model_fields)
    # the composed section validates each key with its owner's field
    with pytest.raises(ValueError, match="clip_l_dropout_rate"):
        FlowSection(clip_l_dropout_rate=2.0)
    assert FlowSection(text_encoder="te.safetensors").text_encoder == "te.safetensors"


def test_a_family_key_defined_twice_is_refused(monkeypatch):
    class Twice(Section):
        clip_l: str | None = None

    monkeypatch.setattr(
        registry, "FAMILIES", (*registry.FAMILIES, dataclasses.replace(FAKE, config_keys=(Twice,)))
    )
    monkeypatch.setattr(flow_schema, "FAMILIES", registry.FAMILIES)
    with pytest.raises(TypeError, match="clip_l is defined by both TransformerFlowKeys and Twice"):
        flow_schema._compose()


def test_a_registered_family_claims_its_models_and_leaves_with_the_block():
    with pytest.raises(ModelError, match="does not exist"):  # no family claims a missing path
        entry_for(MODEL, FlowSection())
    with registry.registered(FAKE):
        assert entry_for(MODEL, FlowSection()) is FAKE
        assert registry.claim_order()[-1] is SD  # its claim is asked last
        lines = (
            "SD 1.x/2.x, SDXL, FLUX.1, FLUX.1 Kontext, FLUX.2, SD3/SD3.5, Z-Image, Chroma, "
            "Qwen-Image, Qwen-Image-Edit, Qwen-Image-Edit-2509/2511, Krea 2, Wan or FAKE-1"
        )
        assert registry.trained_lines("or") == lines
        assert "networks.lora_fake" in registry.network_modules()
    with pytest.raises(ModelError):
        entry_for(MODEL, FlowSection())
    assert "networks.lora_fake" not in registry.network_modules()


def test_config_checks_know_a_registered_family():
    where = "pretrained_model_name_or_path /models/fake-model"
    with registry.registered(FAKE):
        with pytest.raises(ConfigError) as error:
            check_config_family(FAKE, MODEL, FlowSection(), "networks.lora_flux")
        assert str(error.value) == (
            f'network_module = "networks.lora_flux" is for FLUX.1 models, and {where} is a '
            'FAKE-1 model; point it at a FLUX.1 model, or use network_module = "networks.lora_fake"'
        )
        with pytest.raises(ConfigError, match='"networks.lora_fake" is for FAKE-1 models, and'):
            check_config_family(SD, MODEL, FlowSection(), "networks.lora_fake")
        # the network_module check of a loaded family's training choices
        with pytest.raises(ConfigError, match='"networks.lora_fake" is for Fake and this is a sd1'):
            check_network_module(sd.SD1, "networks.lora_fake")
        with pytest.raises(ConfigError, match='is for Flux.1 and this is a fake-a model; use "n'):
            check_network_module(FAKE_MODEL, "networks.lora_flux")


def test_a_network_module_two_families_train_with_is_each_ones_own():
    """kohya's networks.lora_flux trains FLUX.1 and Chroma: a config naming it is either's, and
    still another family's mistake."""
    shared = dataclasses.replace(FAKE, network_module="networks.lora_flux")
    with registry.registered(shared):
        check_config_family(shared, MODEL, FlowSection(), "networks.lora_flux")
        check_config_family(CHROMA, MODEL, FlowSection(), "networks.lora_flux")
        check_config_family(FLUX, MODEL, FlowSection(), "networks.lora_flux")
        with pytest.raises(ConfigError, match='"networks.lora_flux" is for FLUX.1 models, and'):
            check_config_family(SD3, MODEL, FlowSection(), "networks.lora_flux")


def test_flow_keys_of_a_registered_family():
    with registry.registered(FAKE):
        assert registry.flow_key_owners("ae") == (FLUX, KONTEXT, CHROMA, FAKE)
        check_config_family(FAKE, MODEL, FlowSection(ae="ae.safetensors"), None)
        with pytest.raises(
            ConfigError,
            match="ae is a FLUX.1 or FLUX.1 Kontext or Chroma or FAKE-1 key, and pretrained",
        ):
            check_config_family(SD3, MODEL, FlowSection(ae="ae.safetensors"), None)
        with pytest.raises(ConfigError, match="clip_g is an SD3/SD3.5 key, and .* a FAKE-1 model"):
            check_config_family(FAKE, MODEL, FlowSection(clip_g="clip_g.safetensors"), None)
        with pytest.raises(
            ConfigError,
            match="^ae applies to Flux.1 and FLUX.1 Kontext and Chroma and Fake models, not SD3",
        ):
            sd3.SD3_MEDIUM.check_options(
                ModelSection(pretrained_model_name_or_path="m"), FlowSection(ae="ae.safetensors")
            )
    assert registry.flow_key_owners("ae") == (FLUX, KONTEXT, CHROMA)


def test_lora_files_and_lora_tool_labels_of_a_registered_family():
    tensors = {"lora_unet_fake_blocks_0_proj.lora_down.weight": torch.zeros(1, 1)}
    with registry.registered(FAKE):
        assert family_label(FAKE_MODEL) == "FAKE-1 a"
        assert family_group(FAKE_MODEL) == "FAKE-1"
        assert guess_family(["lora_unet_fake_blocks_0_proj"]) == "FAKE-1"
        assert guess_family([], {"ss_base_model_version": "fake_v1"}) == "FAKE-1"
        assert other_family(["lora_unet_double_blocks_0_img_attn_qkv"], None, FAKE_MODEL) == (
            "FLUX.1"
        )
        assert other_family(["lora_unet_fake_blocks_0_proj"], None, FAKE_MODEL) is None
        assert lora_family(tensors) == ("FAKE-1", "lora_unet_fake_blocks_0_proj")
        assert registry.text_prefix_lines("lora_te9") == ["FAKE-1"]
        with pytest.raises(CheckpointError, match="is a LoRA for FAKE-1 models .* model is SDXL"):
            check_lora_file(tensors, "fake.safetensors", "stable-diffusion-xl-v1-base")
    assert guess_family(["lora_unet_fake_blocks_0_proj"]) is None
    assert family_label(FAKE_MODEL) == "fake-a"
