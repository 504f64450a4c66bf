"""network_weights of another model line or adapter kind is named as what it is, before anything
is loaded: a Chroma LoRA on FLUX.1 (the same module names; told by the ss_base_model_version
kohya writes, "chroma"), a FLUX.1 LoRA on Chroma (by that header, or by its FLUX.1-only
modulation modules), a LyCORIS LoKr or LoHa file in a LoRA run or in a LyCORIS run of another
algorithm (named with the settings that read it). Files are what the trainers write: kohya's
FLUX.1 names (lora_unet_double_blocks_0_img_mod_lin, ...), LyCORIS' lokr_w1 / hada_w1_a.
"""

from __future__ import annotations

import pytest
import torch

from library.errors import CheckpointError
from library.models.families.qwenimage.family import qwenimage_family
from library.models.families.registry import families
from library.networks.kohya_names import UNET
from library.networks.lora_file_checks import model_line, version_line
from library.networks.lycoris.spec import LycorisSpec
from library.networks.network_weights import import_network_weights
from tests.conformance.test_family_conformance import _adapted, built, kit_of, variant_params
from tests.models.qwenimage.test_qwenimage_lora_layouts import _adapted as qwen_lora
from tests.models.qwenimage.test_qwenimage_lora_layouts import _transformer as qwen_transformer


def _family_lora(name: str, seed=None):
    """(family, kohya prefix -> the model with the family's default LoRA) of the kit's tiny
    modules."""
    kit = kit_of(name)
    modules = built(name, kit.variant)
    family = kit.family(kit.variant, modules)
    return family, _adapted(kit, family, modules, seed=seed)


@pytest.fixture(scope="module")
def flux_file():
    """A FLUX.1 LoRA as the trainer (and kohya) writes it: every default module, modulation
    included."""
    family, models = _family_lora("flux", seed=3)
    tensors = family.lora_tensors(models)
    assert any("_img_mod_lin." in key for key in tensors)
    return tensors


@pytest.mark.parametrize("family_variant", variant_params())
def test_every_familys_own_files_name_its_own_line(family_variant):
    """The ss_base_model_version a family writes is read as its own model line, so the check
    never refuses a family's own files (Kontext's flux1_kontext is FLUX.1's, the edit models'
    Qwen-Image's, as their LoRAs are)."""
    name, variant = family_variant
    family = kit_of(name).family(variant, built(name, variant))
    assert model_line(family) is not None
    assert version_line({"ss_base_model_version": family.base_model_version}) == model_line(family)


def test_the_longest_version_mark_decides():
    """FLUX.2's "flux2_klein" starts with FLUX.1's mark "flux" too: the longer "flux2" wins,
    whatever the families' order."""
    assert version_line({"ss_base_model_version": "flux2_klein"}) == "FLUX.2"
    assert version_line({"ss_base_model_version": "flux1"}) == "FLUX.1"


def test_a_chroma_lora_on_flux_is_refused_naming_chroma(flux_file):
    """kohya's Chroma LoRA: FLUX.1's names without the modulation modules (Chroma has none),
    ss_base_model_version "chroma". It fits a FLUX.1 model layer for layer, so only the header
    tells."""
    modulation = ("_mod_lin.", "_modulation_lin.")
    chroma_file = {k: v for k, v in flux_file.items() if not any(m in k for m in modulation)}
    family, models = _family_lora("flux")
    import_network_weights(family, models, chroma_file, "plain.safetensors")  # no header: fits
    with pytest.raises(CheckpointError) as caught:
        import_network_weights(family, models, chroma_file, "chroma.safetensors",
                               {"ss_base_model_version": "chroma"})  # fmt: skip
    message = str(caught.value)
    assert "chroma.safetensors is a LoRA for Chroma models" in message
    assert "'chroma'" in message and "the base model is FLUX.1" in message, message


def test_a_flux_lora_on_chroma_is_named_a_flux_lora(flux_file):
    family, models = _family_lora("chroma")
    with pytest.raises(CheckpointError) as caught:
        import_network_weights(family, models, flux_file, "flux.safetensors",
                               {"ss_base_model_version": "flux1"})  # fmt: skip
    assert "is a LoRA for FLUX.1 models" in str(caught.value)
    assert "the base model is Chroma" in str(caught.value)
    with pytest.raises(CheckpointError) as caught:  # no header: its modulation modules tell
        import_network_weights(family, models, flux_file, "flux.safetensors")
    message = str(caught.value)
    assert "\n" not in message and "are FLUX.1's: a LoRA for FLUX.1 models" in message, message
    assert "use a LoRA made for Chroma" in message


def _lycoris_file(algo: str) -> dict[str, torch.Tensor]:
    """A LyCORIS file of ``algo`` as difftune (LyCORIS' names) writes it for Qwen-Image."""
    model = qwen_transformer()
    family = qwenimage_family()
    family.apply_lycoris(model, "unet", LycorisSpec(algo=algo, dim=4, alpha=1.0), "full")
    return family.lora_tensors({UNET: model})


@pytest.mark.parametrize(
    "algo, suffix, label", [("lokr", ".lokr_w1", "LoKr"), ("loha", ".hada_w1_a", "LoHa")]
)
def test_a_lycoris_file_in_a_lora_run_names_the_settings_that_read_it(algo, suffix, label):
    tensors = _lycoris_file(algo)
    assert any(key.endswith(suffix) for key in tensors)
    with pytest.raises(CheckpointError) as caught:
        import_network_weights(qwenimage_family(), {UNET: qwen_lora()}, tensors, "x.safetensors")
    message = str(caught.value)
    assert f"x.safetensors is a LyCORIS {label} file and this run trains LoRA" in message
    assert f'network_module = "lycoris.kohya" and network_args = ["algo={algo}"]' in message


def test_a_lycoris_file_of_another_algorithm_names_it():
    tensors = _lycoris_file("loha")
    model = qwen_transformer()
    family = qwenimage_family()
    family.apply_lycoris(model, "unet", LycorisSpec(algo="lokr", dim=4, alpha=1.0), "full")
    with pytest.raises(CheckpointError) as caught:
        import_network_weights(family, {UNET: model}, tensors, "x.safetensors")
    message = str(caught.value)
    assert "is a LyCORIS LoHa file and this run trains LyCORIS LoKr" in message
    assert 'network_args "algo=loha"' in message


@pytest.mark.parametrize("prefix", ["lora_te", "lora_te2"])
def test_another_familys_text_encoder_names_the_lines_that_have_it(prefix):
    """A file with text-encoder modules under a kohya prefix the base model's family does not
    use (SD's lora_te, SDXL's and SD3's lora_te2, on FLUX.1) is refused before anything loads,
    naming every model line whose files use that prefix (the registry's entries)."""
    family, models = _family_lora("flux")
    name = f"{prefix}_text_model_encoder_layers_0_mlp_fc1"
    tensors = {f"{name}.lora_down.weight": torch.zeros(4, 4),
               f"{name}.lora_up.weight": torch.zeros(4, 4)}  # fmt: skip
    lines = [line for entry in families() for own, line in entry.lora_files.text_prefixes.items()
             if prefix in own]  # fmt: skip
    with pytest.raises(CheckpointError) as caught:
        import_network_weights(family, models, tensors, "te.safetensors")
    message = str(caught.value)
    assert f"is a LoRA for {' or '.join(lines)} models ({name}, ...)" in message
    assert "the base model is FLUX.1" in message and "\n" not in message, message
