"""The family conformance suite: what every registered family must do, checked the same way for
each, against references outside the family's code (diffusers' converters, pipelines and LoRA
loader, peft's merge, LyCORIS' formulas, the model's diffusers folder).

It runs over ``registry.families()``. A family joins by having a test kit, ``KIT`` in
tests/kits/<family name>/kit.py (a ConformanceKit of tests/kits/conformance_kit.py: its tiny
models, its diffusers pipeline class, its name tables and diffusers' converters for them), found
by ``tests.kits.kit_of``; a family without one is listed here as skipped, with the reason. Properties a family does not have (no original-layout name tables, no fused
LyCORIS modules, no single files, no merge by lora_tool) skip with their reason too: the kit's (ConformanceKit.skips) where it gives one.

Properties, per family (and per tiny variant where they are cheap):
- name tables: diffusers <-> original names of the denoiser and the VAE round trip exactly,
  agree with diffusers' own single-file converter, and move fp8 weights bit for bit;
- a diffusers folder loads what diffusers' pipeline loads (module types, weights, tokenizers,
  frozen, eval, CPU), in the weight and VAE dtypes asked for;
- single files: the model as the files users have (ConformanceKit.write_single_files: the
  original-layout checkpoint, or the family's component files) loads to what its folder loads:
  the same family, module types and configs, every weight equal in the same dtype, tokenizers
  that read a caption alike;
- LoRA: the default adapters written as the family's file read back exactly, into fresh
  adapters whose merged weights are the same; diffusers' load_lora_weights reads every key of
  the file and, fused, gives peft's merge of our adapters; ``lora_tool.py merge`` of the file
  into the folder gives peft's merge of them too (read back by diffusers' pipeline), every
  other component untouched;
- LyCORIS: the file reads back into fresh adapters exactly (every family that trains LyCORIS);
  for families whose files name fused original layers, the file merged into the original
  layout with LyCORIS' formulas and converted back by diffusers is the adapted model, output
  for output;
- sampling: each of the kit's prompts (ConformanceKit.sample_cases), sampled during training, is
  the image diffusers' pipeline draws itself from the same folder (its prompt encoding, the
  released scheduler, guidance, VAE), and the settings the case names each change the image;
- the training loss: micro_batch_loss equals the kit's plain reference (loss_reference: the
  family's objective facts written out on diffusers' pipeline modules, conditioned as the
  pipeline conditions them, with the same keyed draws) for each of its configurations
  (loss_cases), on a batch as the data loader gives it (with each image's original size, crop
  and bucket size); each gives another loss, and other sample positions give another loss.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest
import torch

from library.models.families import registry
from library.networks.lora import (
    LoraSpec,
    apply_lora,
    lora_layers,
    randomize_lora,
    set_lora_scale,
)
from library.networks.network_weights import reads_diffusers_layout
from library.saving.lora_file import read_lora_file, save_lora_file
from tests.kits import kit_of
from tests.models.step_inputs import step_inputs
from tests.networks.lora_load_helpers import load_quietly, peft_layers

UNET = "lora_unet"  # kohya's prefix of the denoiser in every family
DENOISERS = ("transformer", "unet")  # diffusers' component name of the denoiser


def _kits() -> dict[str, object]:
    return {e.name: kit_of(e.name) for e in registry.families()}


def _no_kit(entry) -> pytest.MarkDecorator:
    return pytest.mark.skip(
        reason=f"{entry.label} has no test kit (tests/kits/<family>/kit.py): not in the conformance suite"
    )


def family_params():
    """One parameter per registered family: its name (the default variant's checks)."""
    kits = _kits()
    return [
        pytest.param(e.name, id=e.name, marks=() if kits[e.name] else _no_kit(e))
        for e in registry.families()
    ]


def variant_params():
    """One parameter per tiny variant of each family with a kit: (family, variant)."""
    params = []
    for entry in registry.families():
        kit = _kits()[entry.name]
        if kit is None:
            params.append(pytest.param((entry.name, None), id=entry.name, marks=_no_kit(entry)))
            continue
        params += [pytest.param((entry.name, v), id=f"{entry.name}-{v}") for v in kit.variants]
    return params


@functools.cache
def _built(name: str, variant: str, seed: int = 0) -> dict[str, torch.nn.Module]:
    return kit_of(name).build(variant, seed)


def built(name: str, variant: str) -> dict[str, torch.nn.Module]:
    """The kit's tiny modules of ``variant``, a private copy."""
    return copy.deepcopy(_built(name, variant))


def denoiser_name(modules) -> str:
    return next(n for n in DENOISERS if n in modules)


def pipeline(folder, kit=None):
    """diffusers' own reading of a folder: the class model_index.json names, its modules (with
    the kit's ``pipeline_keys`` for parts diffusers cannot read here by itself)."""
    from diffusers import DiffusionPipeline

    keys = kit.pipeline_keys(folder) if kit is not None and kit.pipeline_keys else {}
    return DiffusionPipeline.from_pretrained(str(folder), local_files_only=True, **keys)


def pipeline_modules(pipe) -> list[tuple[str, torch.nn.Module]]:
    """(component name, module) of the denoiser, the VAE and the text encoders, in the order
    Components holds them."""
    names = [denoiser_name(pipe.components), "vae"]
    names += [
        f"text_encoder{s}" for s in ("", "_2", "_3") if getattr(pipe, f"text_encoder{s}", None)
    ]
    return [(n, getattr(pipe, n)) for n in names]


def assert_same(got, want, dtype_too: bool = True) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].shape == value.shape, key
        if dtype_too:
            assert got[key].dtype == value.dtype, key
        assert torch.equal(got[key], value), key


# --- name tables ------------------------------------------------------------------------------


def _table_check(table, module) -> None:
    state, config = module.state_dict(), dict(module.config)
    original = table.to_original(state, config)
    assert_same(table.from_original(original, config), state)
    assert_same(table.reference(original, config), state)  # diffusers' converter
    # Conversions only cut and join: fp8-stored files convert without arithmetic.
    fp8 = {k: v.to(torch.float8_e4m3fn) for k, v in state.items()}
    back = table.from_original(table.to_original(fp8, config), config)
    assert set(back) == set(fp8)
    for key, value in fp8.items():
        assert back[key].dtype == torch.float8_e4m3fn, key
        assert torch.equal(back[key].view(torch.uint8), value.view(torch.uint8)), key


@pytest.mark.parametrize("family_variant", variant_params())
def test_denoiser_names_round_trip_and_match_diffusers(family_variant):
    name, variant = family_variant
    kit = kit_of(name)
    if kit.denoiser_names is None:
        pytest.skip(
            kit.skip_reason("denoiser_names", f"{name}'s files name the denoiser as diffusers does")
        )
    modules = _built(name, variant)
    _table_check(kit.denoiser_names, modules[denoiser_name(modules)])


@pytest.mark.parametrize("name", family_params())
def test_vae_names_round_trip_and_match_diffusers(name):
    kit = kit_of(name)
    if kit.vae_names is None:
        pytest.skip(kit.skip_reason("vae_names", f"{name}'s files name the VAE as diffusers does"))
    _table_check(kit.vae_names, _built(name, kit.variant)["vae"])


# --- a diffusers folder -----------------------------------------------------------------------


def _load(name: str, folder, weight_dtype, vae_dtype):
    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection

    model = ModelSection(pretrained_model_name_or_path=str(folder))
    return registry.family_entry(name).load(model, FlowSection(), weight_dtype, vae_dtype)


@pytest.mark.parametrize("name", family_params())
def test_folder_loads_what_diffusers_loads(name, kit_folders, read_pipeline):
    kit = kit_of(name)
    folder = kit_folders(name, kit.variant)
    pipe = read_pipeline(folder, kit)
    assert type(pipe).__name__ == kit.pipeline(kit.variant)
    parts = _load(name, folder, torch.float32, torch.float32)
    assert parts.model_dir == folder.absolute()
    ours = [parts.denoiser, parts.vae, *parts.text_encoders]
    theirs = pipeline_modules(pipe)
    assert len(ours) == len(theirs)
    for module, (component, reference) in zip(ours, theirs, strict=True):
        assert type(module) is type(reference), component
        assert_same(module.state_dict(), reference.state_dict())
        assert not module.training and not any(p.requires_grad for p in module.parameters())
        assert all(p.device.type == "cpu" for p in module.parameters()), component
    # The tokenizers are diffusers' and read a caption as diffusers' do (a processor, which also
    # prepares images, by its tokenizer: its image half has its family's own tests).
    subfolders = parts.family.tokenizer_subfolders
    for tokenizer, sub in zip(parts.tokenizers, subfolders, strict=True):
        reference = getattr(pipe, sub)
        if hasattr(reference, "image_processor"):
            tokenizer, reference = tokenizer.tokenizer, reference.tokenizer
        assert type(tokenizer) is type(reference), sub
        assert tokenizer("a cat").input_ids == reference("a cat").input_ids

    # In the dtypes asked for: the weights in bfloat16, the VAE in float32.
    cast = _load(name, folder, torch.bfloat16, torch.float32)
    for module, (component, reference) in zip(
        [cast.denoiser, cast.vae, *cast.text_encoders], theirs, strict=True
    ):
        dtype = torch.float32 if component == "vae" else torch.bfloat16
        want = {
            k: v.to(dtype) if v.is_floating_point() else v
            for k, v in reference.state_dict().items()
        }
        assert_same(module.state_dict(), want)


# --- single files -----------------------------------------------------------------------------


def _modules_of(parts) -> list[torch.nn.Module]:
    return [parts.denoiser, parts.vae, *parts.text_encoders]


@pytest.mark.parametrize("family_variant", variant_params())
def test_single_files_load_what_the_folder_loads(family_variant, kit_folders, tmp_path):
    """The model as the single files users have (the original-layout checkpoint, or the
    family's component files), read by our loader, is the model its diffusers folder is: the
    same family, module types and configs, every weight equal in the same dtype, and the
    tokenizers read a caption the same way. The folder's modules are diffusers' own
    (test_folder_loads_what_diffusers_loads); the files are written in the original names
    checked against diffusers' converters above."""
    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.loader import load_components

    name, variant = family_variant
    kit = kit_of(name)
    if kit.write_single_files is None:
        pytest.skip(kit.skip_reason("single_files", f"{name}-{variant} has no single files"))
    model, flow = kit.write_single_files(tmp_path / "files", variant, 0)
    parts = load_components(ModelSection(**model), torch.float32, FlowSection(**flow))
    folder = kit_folders(name, variant)
    want = _load(name, folder, torch.float32, torch.float32)
    assert (
        parts.is_single_file
        and parts.model_dir == Path(model["pretrained_model_name_or_path"]).absolute()
    )
    assert parts.family == want.family
    assert len(parts.text_encoders) == len(want.text_encoders)
    held = kit.file_module or (lambda variant, module: module)
    references = [held(variant, module) for module in _modules_of(want)]
    for module, reference in zip(_modules_of(parts), references, strict=True):
        assert type(module) is type(reference)
        assert _config(module) == _config(reference), type(module).__name__
        assert_same(module.state_dict(), reference.state_dict())
        assert not module.training and not any(p.requires_grad for p in module.parameters())
    assert len(parts.tokenizers) == len(want.tokenizers)
    for tokenizer, reference in zip(parts.tokenizers, want.tokenizers, strict=True):
        if hasattr(reference, "image_processor"):  # a processor: the same image settings
            assert tokenizer.image_processor.to_dict() == reference.image_processor.to_dict()
            tokenizer, reference = tokenizer.tokenizer, reference.tokenizer
        caption = LOSS_BATCH["captions"][1]
        assert tokenizer(caption).input_ids == reference(caption).input_ids


def _config(module) -> dict:
    """A module's config as plain JSON values, without the how-it-was-saved keys (in its
    sub-configs too: a vision-language encoder's text_config and vision_config)."""
    config = module.config
    config = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    skip = ("transformers_version", "dtype", "torch_dtype", "architectures")

    def kept(data: dict) -> dict:
        return {
            k: kept(v) if isinstance(v, dict) and k.endswith("_config") else v
            for k, v in data.items()
            if not k.startswith("_") and k not in skip
        }

    return json.loads(json.dumps(kept(config), default=list))


# --- LoRA files -------------------------------------------------------------------------------


def _adapted(kit, family, modules, seed=None, skip=None, alpha=2.0, vary_alpha=False):
    """kohya prefix -> model with the family's default LoRA (random with ``seed``, fresh
    without), on the denoiser and every text encoder the family trains; ``vary_alpha``: the
    layers of each block get that block's own alpha."""
    models = {UNET: modules[denoiser_name(modules)]}
    pairs = zip(family.text_encoder_lora_prefixes, family.text_encoder_subfolders, strict=True)
    for index, (prefix, sub) in enumerate(pairs):
        if family.trains_text_encoder(index):
            models[prefix] = modules[sub]
    conv = 2 if kit.lora_conv else None
    spec = LoraSpec(4, alpha, conv_dim=conv, conv_alpha=None if conv is None else alpha)
    gen = torch.Generator().manual_seed(seed or 0)
    for prefix, model in models.items():
        role = "unet" if prefix == UNET else "text_encoder"
        targets = family.adapter_targets(model, role, kit.lora_conv)
        if skip is not None and prefix == UNET:
            targets = {p: k for p, k in targets.items() if not skip(p)}
        apply_lora(model, targets, spec)
        if seed is not None:
            randomize_lora(model, gen, std=0.05)
        if vary_alpha:
            # alpha 1, 2 or 3 by block (layers fused into one file module, such as q, k and v,
            # share a block and so an alpha): a file that kept one alpha for all, or gave a
            # layer another block's, cannot round-trip
            set_lora_scale(model, {path: 1.0 + _block(path) % 3 for path in lora_layers(model)})
    return models


def _block(path: str) -> int:
    """The first index in a module path (its block), 0 for none."""
    return next((int(part) for part in path.split(".") if part.isdigit()), 0)


@torch.no_grad()
def peft_merged(model) -> dict[str, torch.Tensor]:
    """``model``'s weights with its peft adapters merged by peft, by the unadapted paths (a
    copy is merged; ``model`` keeps its adapters)."""
    model = copy.deepcopy(model)
    for layer in lora_layers(model).values():
        layer.merge()
    return {
        k.replace(".base_layer.", "."): v
        for k, v in model.state_dict().items()
        if ".lora_" not in k
    }


@pytest.fixture(scope="module")
def lora_files(tmp_path_factory):
    """(family, variant) -> (its family instance, the adapted models by kohya prefix, the
    file's tensors, the file): the family's default LoRA on the variant's tiny modules, random,
    each block with its own alpha, written on first use."""
    cache = {}

    def lora_file(name: str, variant: str):
        if (name, variant) not in cache:
            kit = kit_of(name)
            modules = built(name, variant)
            family = kit.family(variant, modules)
            ours = _adapted(kit, family, modules, seed=3, vary_alpha=True)
            tensors = family.lora_tensors(ours)
            path = tmp_path_factory.mktemp(f"lora-{name}") / f"{variant}.safetensors"
            save_lora_file(path, tensors, {}, torch.float32)
            cache[name, variant] = (family, ours, tensors, path)
        return cache[name, variant]

    return lora_file


@pytest.mark.parametrize("family_variant", variant_params())
def test_lora_file_round_trip_is_exact(family_variant, lora_files):
    name, variant = family_variant
    kit = kit_of(name)
    family, ours, tensors, path = lora_files(name, variant)
    read, _ = read_lora_file(path, reads_diffusers_layout(family))
    assert_same(read, tensors)
    fresh = _adapted(kit, family, built(name, variant), alpha=1.0)
    family.load_lora_tensors(fresh, read, str(path))
    assert_same(family.lora_tensors(fresh), tensors)  # the adapters hold what was written
    for prefix, model in ours.items():  # and, alphas too, are the same adapters
        if any(key.endswith(".alpha") for key in tensors):
            assert_same(peft_merged(fresh[prefix]), peft_merged(model))
            continue
        # a layout without alphas (peft's) holds alpha / r inside lora_B: the same adapters
        # up to that product's rounding
        mine, theirs = peft_merged(model), peft_merged(fresh[prefix])
        assert sorted(mine) == sorted(theirs), prefix
        for key, value in mine.items():
            torch.testing.assert_close(theirs[key], value, rtol=1e-6, atol=1e-7, msg=key)


@pytest.mark.parametrize("family_variant", variant_params())
def test_lora_file_merged_into_the_base_is_peft_merge(
    family_variant, kit_folders, lora_files, read_pipeline, tmp_path
):
    """``lora_tool.py merge`` of the family's default LoRA file into the tiny folder (a diffusers
    folder out, read back by diffusers' own pipeline) holds, in every adapted denoiser and text
    encoder, peft's merge of the adapters the file was written from (W + alpha / r * B @ A,
    each block its own alpha); the other components are the base's, bit for bit."""
    from library.lora_tools import cli

    name, variant = family_variant
    kit = kit_of(name)
    if "merge" in kit.skips:
        pytest.skip(kit.skips["merge"])
    family, ours, _, path = lora_files(name, variant)
    base = kit_folders(name, variant)
    out = tmp_path / "merged"
    assert cli.main(["merge", "--model", str(base), "--loras", str(path),
                     "--output_dir", str(out)]) == 0  # fmt: skip
    merged = dict(pipeline_modules(pipeline(out, kit)))
    plain = dict(pipeline_modules(read_pipeline(base, kit)))
    components = {UNET: denoiser_name(merged)}
    pairs = zip(family.text_encoder_lora_prefixes, family.text_encoder_subfolders, strict=True)
    components.update(pairs)
    assert ours.keys() <= components.keys()
    for prefix, model in ours.items():
        theirs = merged[components[prefix]].state_dict()
        mine = peft_merged(model)
        assert sorted(theirs) == sorted(mine), prefix
        for key, value in mine.items():
            assert theirs[key].dtype == value.dtype, key
            torch.testing.assert_close(theirs[key], value, rtol=1e-5, atol=1e-6, msg=key)
        base_state = plain[components[prefix]].state_dict()
        assert any(not torch.equal(theirs[k], v) for k, v in base_state.items()), prefix
    adapted = {components[prefix] for prefix in ours}
    for component, module in merged.items():
        if component not in adapted:
            assert_same(module.state_dict(), plain[component].state_dict())


@pytest.mark.parametrize("family_variant", variant_params())
def test_diffusers_loads_every_key_of_our_lora_file(family_variant, kit_folders, tmp_path):
    """diffusers' load_lora_weights (as A1111/ComfyUI, it reads kohya's names; a family that
    also writes diffusers' layout is checked in that one) takes every key of the file, adapts
    the layers we adapted and, fused, holds peft's merge of our adapters."""
    name, variant = family_variant
    kit = kit_of(name)
    pipe = pipeline(kit_folders(name, variant), kit)
    modules = {n: copy.deepcopy(m) for n, m in pipeline_modules(pipe)}
    before = {n: m.state_dict() for n, m in modules.items()}
    family = kit.family(variant, modules)
    ours = _adapted(kit, family, modules, seed=7, skip=kit.diffusers_lora_skips)
    if "diffusers" in family.lora_formats:
        tensors = family.diffusers_lora_tensors(ours)
    else:
        tensors = family.lora_tensors(ours)
    path = save_lora_file(tmp_path / "lora.safetensors", tensors, {}, torch.float32)
    components = {UNET: denoiser_name(modules)}
    pairs = zip(family.text_encoder_lora_prefixes, family.text_encoder_subfolders, strict=True)
    components.update(pairs)
    # diffusers says so of each text encoder the file holds no keys for (a family that trains
    # none of them: Chroma's T5)
    untrained = tuple(components[p] for p in components if p not in ours)
    noise = load_quietly(pipe, path, untrained)
    assert not noise, noise  # e.g. "unexpected keys not found in the model"
    for prefix, model in ours.items():
        component = getattr(pipe, components[prefix])
        assert sorted(peft_layers(component)) == sorted(lora_layers(model)), prefix
    pipe.fuse_lora(components=[components[prefix] for prefix in ours])
    for prefix, model in ours.items():
        state = getattr(pipe, components[prefix]).state_dict()
        theirs = {k.replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}
        mine = peft_merged(model)
        assert sorted(theirs) == sorted(mine), prefix
        for key, value in mine.items():
            torch.testing.assert_close(theirs[key], value, rtol=1e-5, atol=1e-6, msg=key)
        plain = before[components[prefix]]
        assert any(not torch.equal(theirs[k], v) for k, v in plain.items()), prefix  # it mattered


# --- LyCORIS files ----------------------------------------------------------------------------

LYCORIS = {
    "loha-dora": dict(algo="loha", dim=4, alpha=2.0, dora_wd=True),
    "lokr": dict(algo="lokr", dim=4, alpha=2.0, factor=4, decompose_both=True),
    "locon": dict(algo="lora", dim=4, alpha=2.0, use_tucker=True),
}


def _fused_lycoris(name: str):
    """(kit, modules, family) of a family whose LyCORIS files name its original fused layers."""
    kit = kit_of(name)
    modules = built(name, kit.variant)
    family = kit.family(kit.variant, modules)
    fused = hasattr(family, "lycoris_modules") and "lycoris_fused" not in kit.skips
    if not fused or kit.denoiser_names is None:
        default = f"{name}'s LyCORIS files name each diffusers layer (tests/networks/lycoris)"
        pytest.skip(kit.skip_reason("lycoris_fused", default))
    return kit, modules, family


@torch.no_grad()
def _randomize_lycoris(model, seed: int) -> None:
    """Non-zero values in every adapter tensor (a fresh adapter changes nothing): of the fused
    modules, or of each adapted layer in a family without them."""
    from library.networks.adapters import lycoris_layers
    from library.networks.lycoris_fused import module_layers

    gen = torch.Generator().manual_seed(seed)
    for layer in (module_layers(model) or lycoris_layers(model)).values():
        for param in layer.adapter_parameters():
            param.add_(torch.randn(param.shape, generator=gen) * 0.1)


def _run(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).sample


@pytest.mark.parametrize("case", list(LYCORIS))
@pytest.mark.parametrize("name", family_params())
def test_lycoris_file_merged_into_the_original_layout_is_the_adapted_model(name, case):
    """The file names the ORIGINAL model's layers (fused q/k/v, swapped modulation halves): each
    module merged into the original layout's weight with LyCORIS' formulas (file_math, itself
    compared with the lycoris-lora package) and converted back by diffusers' converter is the
    adapted model, output for output."""
    from library.networks.lycoris import file_math
    from library.networks.lycoris.spec import LycorisSpec

    kit, modules, family = _fused_lycoris(name)
    model = modules[denoiser_name(modules)]
    plain = copy.deepcopy(model)
    family.apply_lycoris(model, "unet", LycorisSpec(**LYCORIS[case]), "full")
    _randomize_lycoris(model, seed=3)
    tensors = family.lora_tensors({UNET: model})

    lycoris = {m.name: m for m in family.lycoris_modules(plain, "full")}
    assert {key.split(".", 1)[0] for key in tensors} == set(lycoris)
    assert any(m.fused for m in lycoris.values())
    config = dict(plain.config)
    original = kit.denoiser_names.to_original(plain.state_dict(), config)
    original = {k: v.clone() for k, v in original.items()}
    for module_name, module in lycoris.items():
        parts = {
            k.split(".", 1)[1]: v for k, v in tensors.items() if k.split(".")[0] == module_name
        }
        key = f"{module.original}.weight"
        original[key] = file_math.merged_weight(original[key], parts).to(original[key].dtype)
    reference = copy.deepcopy(plain)
    reference.load_state_dict(kit.denoiser_names.reference(original, config))
    inputs = kit.denoiser_inputs(plain, 1)
    ours, theirs = _run(model, inputs), _run(reference, inputs)
    assert torch.allclose(ours, theirs, atol=2e-5, rtol=1e-4), (ours - theirs).abs().max()
    assert (theirs - _run(plain, inputs)).abs().max() > 1e-3  # the adapters change the output


@pytest.mark.parametrize("name", family_params())
def test_lycoris_file_reads_back_into_fresh_adapters(name):
    """Every family that trains LyCORIS (fused original layers or one module per layer)."""
    from library.networks.lycoris.spec import LycorisSpec

    kit = kit_of(name)
    modules = built(name, kit.variant)
    family = kit.family(kit.variant, modules)
    if "lycoris.kohya" not in family.network_modules:
        pytest.skip(kit.skip_reason("lycoris", f"{name} trains no LyCORIS adapters"))
    spec = LycorisSpec(**LYCORIS["loha-dora"])
    model = modules[denoiser_name(modules)]
    family.apply_lycoris(model, "unet", spec, "full")
    _randomize_lycoris(model, seed=5)
    tensors = family.lora_tensors({UNET: model})
    fresh = built(name, kit.variant)[denoiser_name(modules)]
    family.apply_lycoris(fresh, "unet", spec, "full")
    family.load_lora_tensors({UNET: fresh}, tensors, "f.safetensors")
    assert_same(family.lora_tensors({UNET: fresh}), tensors)
    # and every adapter parameter, not only what the file holds
    assert_same(fresh.state_dict(), model.state_dict())


# --- sampling ---------------------------------------------------------------------------------

PROMPT = dict(index=0, prompt="a red circle", negative_prompt="", width=64, height=64, seed=7,
              steps=2, scale=None, sampler=None)  # fmt: skip


def _pixels_of(path):
    import numpy as np
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"), dtype=np.int16)


def _components(folder, case):
    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.loader import load_components

    model = ModelSection(pretrained_model_name_or_path=str(folder), **case.model)
    return load_components(model, torch.float32, FlowSection(**case.flow))


@torch.no_grad()
def _their_image(folder, pipe, case, p, **changes):
    import numpy as np

    call = {**case.call, **changes}
    scheduler = call.pop("scheduler", case.scheduler)
    if scheduler is not None:
        pipe.scheduler = scheduler(folder)
    out = pipe(
        prompt=p.prompt,
        width=p.width,
        height=p.height,
        num_inference_steps=p.steps,
        generator=torch.Generator().manual_seed(p.seed),
        output_type="pil",
        **call,
    )
    # a video pipeline's output is its clips' frames: a one-frame clip is the image
    image = out.images[0] if hasattr(out, "images") else out.frames[0][0]
    return np.asarray(image.convert("RGB"), dtype=np.int16)


@pytest.mark.parametrize("family_variant", variant_params())
def test_sample_equals_the_diffusers_pipeline(family_variant, kit_folders, tmp_path):
    """Each of the kit's prompts, sampled during training (sample_images on the folder as our
    loader reads it), is the image diffusers' pipeline draws from the same folder itself (its
    own prompt encoding, released scheduler, guidance and VAE) for the same prompt, seed and
    steps; and each of the case's other settings gives another image (the comparison pins it)."""
    from diffusers import DiffusionPipeline

    from library.sampling.generate import sample_images
    from library.sampling.prompts import SamplePrompt

    name, variant = family_variant
    kit = kit_of(name)
    cases = kit.sample_cases(variant) if kit.sample_cases else ()
    if not cases:
        pytest.skip(kit.skip_reason("sample", f"{name}-{variant} gives no sampling case"))
    folder = kit_folders(name, variant)
    for index, case in enumerate(cases):
        p = SamplePrompt(**{**PROMPT, **case.prompt})
        done = sample_images(_components(folder, case), [p], step=index,
                             output_dir=tmp_path / "out", output_name="s")  # fmt: skip
        ours = _pixels_of(done.images[0])
        assert ours.shape == (p.height, p.width, 3) and ours.std() > 0, index
        keys = case.pipeline_keys
        keys = keys(folder) if callable(keys) else keys
        pipe = DiffusionPipeline.from_pretrained(str(folder), local_files_only=True, **keys)
        pipe.set_progress_bar_config(disable=True)
        theirs = _their_image(folder, pipe, case, p)
        assert int(abs(ours - theirs).max()) <= case.tolerance, (index, abs(ours - theirs).max())
        for changes in case.differs:
            other = _their_image(folder, pipe, case, p, **changes)
            assert int(abs(ours - other).max()) > 1, (index, changes)


# --- the training loss ------------------------------------------------------------------------

SEED = 11
LOSS_BATCH = {
    "captions": ["a red circle", "a much longer caption about a shape on gray paper"],
    "loss_weights": torch.tensor([1.0, 0.5]),
    "positions": torch.tensor([3, 8]),
    "epoch": 2,
    # what the data loader gives every batch (height, width): each image's size before the
    # bucket's resize, the crop's top-left corner, the bucket's size (the pixels' 64 x 48)
    "original_sizes": torch.tensor([[96, 48], [64, 96]]),
    "crop_top_lefts": torch.tensor([[16, 0], [0, 24]]),
    "target_sizes": torch.tensor([[64, 48], [64, 48]]),
}


def _loss_pixels() -> torch.Tensor:
    """Two 64 x 48 images in [-1, 1]."""
    return torch.rand(2, 3, 64, 48, generator=torch.Generator().manual_seed(5)) * 2 - 1


@pytest.mark.parametrize("family_variant", variant_params())
def test_loss_equals_a_plain_reference(family_variant, kit_folders, read_pipeline):
    """The trainer's micro-batch loss (micro_batch_loss on the folder as our loader reads it)
    equals the kit's plain reference, written from the family's objective facts on diffusers'
    pipeline of the same folder with the same keyed draws, for each of the kit's configurations;
    each configuration gives another loss (its options reach the loss), and each sample's draws
    follow its position (other positions, another loss)."""
    from library.training.step import micro_batch_loss

    name, variant = family_variant
    kit = kit_of(name)
    cases = kit.loss_cases(variant) if kit.loss_cases and kit.loss_reference else ()
    if not cases:
        pytest.skip(kit.skip_reason("loss", f"{name}-{variant} gives no plain reference loss"))
    folder = kit_folders(name, variant)
    pipe = read_pipeline(folder, kit)
    batch = {**LOSS_BATCH, "pixel_values": _loss_pixels()}
    losses = []
    for case in cases:
        inputs = step_inputs(_components(folder, case), SEED, case.training)
        with torch.no_grad():
            ours = micro_batch_loss(inputs, batch)
            expected = kit.loss_reference(pipe, batch, SEED, case)
        torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7, msg=str(case))
        losses.append(ours.item())
    assert len(set(losses)) == len(losses), losses
    with torch.no_grad():
        other = micro_batch_loss(inputs, {**batch, "positions": torch.tensor([5, 1])})
    assert not torch.allclose(ours, other)
