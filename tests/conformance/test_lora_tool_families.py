"""The LoRA toolbox (lora_tool.py check, convert, resize, extract) serves every registered
family, checked the same way for each against references outside the toolbox: the trainer's own
network_weights import, diffusers' load_lora_weights, peft's merge, and plain torch (the weight
change of two models, its SVD).

Like test_family_conformance.py, it runs over the registry through each family's test kit: its
tiny diffusers folder and modules, its family instance, and its default LoRA made by our
adapters. A family the toolbox cannot serve must be refused by name, never given a wrong file;
a new family joins these checks with its kit.
"""

from __future__ import annotations

import copy
import shutil

import pytest
import torch

from library.errors import DifftuneError
from library.lora_tools.layouts import LAYOUTS, detect_layout
from library.models.families import registry
from library.networks.linear_files import unfold_peft
from library.networks.lora import ADAPTER, LoraSpec, apply_lora, lora_layers, randomize_lora
from library.networks.network_weights import import_network_weights, read_network_weights
from library.saving.lora_file import save_lora_file
from tests.conformance.test_family_conformance import (
    UNET,
    _adapted,
    denoiser_name,
    family_params,
    kit_of,
    peft_merged,
    pipeline,
    pipeline_modules,
)
from tests.lora_tools.model_helpers import read, run_tool
from tests.networks.lora_load_helpers import load_quietly


def _pipeline_parts(read_pipeline, name, folder):
    """(kit, private copies of the modules of diffusers' pipeline of the folder, the family)."""
    kit = kit_of(name)
    modules = {n: copy.deepcopy(m) for n, m in pipeline_modules(read_pipeline(folder, kit))}
    return kit, modules, kit.family(kit.variant, modules)


def _fresh(kit, family, modules):
    """The family's default adapters (``_own_file``'s layers), fresh (alpha 1), on private
    copies of ``modules``."""
    copies = {n: copy.deepcopy(m) for n, m in modules.items()}
    return _adapted(kit, family, copies, skip=kit.diffusers_lora_skips, alpha=1.0)


def _convert(source, folder, to, out, *extra) -> int:
    return run_tool(
        "convert", "--input", source, "--model", folder, "--to", to, "--output", out, *extra
    )


def _own_file(read_pipeline, name, folder, tmp_path, seed=3):
    """(kit, modules, family, our adapters, the file the trainer writes for them)."""
    kit, modules, family = _pipeline_parts(read_pipeline, name, folder)
    copies = {n: copy.deepcopy(m) for n, m in modules.items()}
    ours = _adapted(kit, family, copies, seed=seed, skip=kit.diffusers_lora_skips,
                    vary_alpha=True)  # fmt: skip
    path = save_lora_file(tmp_path / "ours.safetensors", family.lora_tensors(ours), {},
                          torch.float32)  # fmt: skip
    return kit, modules, family, ours, path


def _trainer_reads(fresh, family, ours, path) -> bool:
    """What network_weights does with the file, imported into a copy of ``fresh`` (``_fresh``'s
    adapters, made once: copying them is cheaper than adapting again): False when it refuses
    it; else the adapters it fills must be ours (their merged weights, alphas included)."""
    fresh = copy.deepcopy(fresh)
    try:
        tensors = read_network_weights(family, path)
        import_network_weights(family, fresh, tensors, str(path))
    except DifftuneError:
        return False
    for prefix, model in ours.items():
        want, got = peft_merged(model), peft_merged(fresh[prefix])
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6, msg=key)
    return True


@pytest.mark.parametrize("name", family_params())
def test_the_family_writes_its_own_layout(name, kit_folders, read_pipeline, tmp_path):
    """The layout the registry says the family's files are in is the one its key map writes."""
    _, _, family, _, path = _own_file(read_pipeline, name, kit_folders(name), tmp_path)
    tensors, _ = read(path)
    own = registry.entry_of(family).tool.own_layout
    assert own in LAYOUTS
    assert detect_layout(tensors, path) == own


@pytest.mark.parametrize("name", family_params())
def test_check_reports_what_network_weights_reads(
    name, kit_folders, read_pipeline, tmp_path, capsys
):
    """For our file in each layout (convert's output; diffusers' with alpha folded, so that a
    reader that ignores the peft header still reads our change): check's difftune column says
    "reads all" exactly when the trainer's network_weights import takes the file, and what
    the import then holds is our adapters."""
    folder = kit_folders(name)
    kit, modules, family, ours, own = _own_file(read_pipeline, name, folder, tmp_path)
    files = {detect_layout(read(own)[0], own): own}
    for layout in LAYOUTS:
        if layout in files:
            continue
        out = tmp_path / f"{layout}.safetensors"
        extra = ("--fold_alpha",) if layout == "diffusers" else ()
        assert _convert(own, folder, layout, out, *extra) == 0, layout
        files[layout] = out
    verdicts, fresh = {}, _fresh(kit, family, modules)
    for layout, path in files.items():
        capsys.readouterr()
        code = run_tool("check", "--lora", path, "--model", folder, "--loader", "difftune")
        out = capsys.readouterr().out
        reads = _trainer_reads(fresh, family, ours, path)
        assert (code == 0) == reads, (layout, out)
        assert ("difftune: reads all" in out) == reads, (layout, out)
        verdicts[layout] = reads
    assert verdicts[registry.entry_of(family).tool.own_layout]  # our own files, at least


@pytest.mark.parametrize("name", family_params())
def test_convert_there_and_back_and_diffusers_applies_it(
    name, kit_folders, read_pipeline, tmp_path
):
    """Our file to each other layout and back is the file again, bit for bit; the diffusers
    layout (alphas in the peft header) is applied by diffusers' own load_lora_weights exactly as
    peft merges our adapters."""
    folder = kit_folders(name)
    kit, _, family, ours, own = _own_file(read_pipeline, name, folder, tmp_path)
    mine, _ = read(own)
    own_layout = detect_layout(mine, own)
    for layout in (layout for layout in LAYOUTS if layout != own_layout):
        there, back = tmp_path / f"{layout}.safetensors", tmp_path / f"{layout}-back.safetensors"
        assert _convert(own, folder, layout, there) == 0, layout
        assert detect_layout(read(there)[0], there) == layout
        assert _convert(there, folder, "difftune", back) == 0, layout
        again, _ = read(back)
        assert sorted(again) == sorted(mine), layout
        for key, value in mine.items():
            assert again[key].dtype == value.dtype and torch.equal(again[key], value), key
    pipe = pipeline(folder, kit)  # its own: diffusers loads the LoRA into it
    components = {UNET: denoiser_name(pipe.components)}
    pairs = zip(family.text_encoder_lora_prefixes, family.text_encoder_subfolders, strict=True)
    components.update(pairs)
    untrained = tuple(components[p] for p in components if p not in ours)
    noise = load_quietly(pipe, tmp_path / "diffusers.safetensors", untrained)
    assert not noise, noise
    pipe.fuse_lora(components=[components[prefix] for prefix in ours])
    for prefix, model in ours.items():
        state = getattr(pipe, components[prefix]).state_dict()
        theirs = {k.replace(".base_layer.", "."): v for k, v in state.items() if ".lora_" not in k}
        mine_merged = peft_merged(model)
        assert sorted(theirs) == sorted(mine_merged), prefix
        for key, value in mine_merged.items():
            torch.testing.assert_close(theirs[key], value, rtol=1e-5, atol=1e-6, msg=key)


def _truncated(delta: torch.Tensor, rank: int) -> torch.Tensor:
    """The best rank-``rank`` approximation of a matrix: its SVD, cut (plain torch, float64)."""
    u, s, vh = torch.linalg.svd(delta.double().reshape(delta.shape[0], -1), full_matrices=False)
    return (u[:, :rank] * s[:rank]) @ vh[:rank]


def _rank_adapters(family, model, rank: int):
    """{UNET: a copy of ``model``} with the family's default LoRA of ``rank`` (alpha 1)."""
    model = copy.deepcopy(model)
    apply_lora(model, family.adapter_targets(model, "unet", False), LoraSpec(rank, 1.0))
    return {UNET: model}


def _layer_deltas(model) -> dict[str, torch.Tensor]:
    """diffusers path -> the weight change of its adapter, ``scaling * B @ A`` (peft's numbers,
    by hand), as a float64 matrix."""
    deltas = {}
    for path, layer in lora_layers(model).items():
        down = layer.lora_A[ADAPTER].weight.detach().double()
        up = layer.lora_B[ADAPTER].weight.detach().double()
        product = up.reshape(up.shape[0], -1) @ down.reshape(down.shape[0], -1)
        deltas[path] = float(layer.scaling[ADAPTER]) * product
    return deltas


@pytest.mark.parametrize("name", family_params())
def test_extract_is_the_truncated_svd_of_the_weight_change(
    name, kit_folders, read_pipeline, tmp_path
):
    """extract from the tiny base and a copy whose denoiser holds a rank-4 change: read by the
    trainer's import into rank-2 adapters, each adapted layer's change is the best rank-2
    approximation of tuned - base (plain torch's SVD of the two folders' weights)."""
    folder = kit_folders(name)
    kit, modules, family = _pipeline_parts(read_pipeline, name, folder)
    sub = denoiser_name(modules)
    base = modules[sub]
    changed = _rank_adapters(family, base, 4)[UNET]
    randomize_lora(changed, torch.Generator().manual_seed(5), std=0.1)
    tuned_weights = peft_merged(changed)
    tuned = tmp_path / "tuned"
    shutil.copytree(folder, tuned)
    for old in (tuned / sub).glob("*.safetensors*"):
        old.unlink()
    saved = copy.deepcopy(base)
    saved.load_state_dict(tuned_weights)
    saved.save_pretrained(tuned / sub)
    out = tmp_path / "extracted.safetensors"
    code = run_tool("extract", "--base", folder, "--tuned", tuned, "--rank", 2, "--min_diff", 0,
                    "--output", out)  # fmt: skip
    assert code == 0
    tensors, _ = read(out)
    assert detect_layout(tensors, out) == registry.entry_of(family).tool.own_layout
    fresh = _rank_adapters(family, base, 2)
    import_network_weights(family, fresh, read_network_weights(family, out), str(out))
    got = _layer_deltas(fresh[UNET])
    plain = base.state_dict()
    assert sorted(got) == sorted(lora_layers(changed))
    for path, delta in got.items():
        weight = f"{path}.weight"
        want = _truncated(tuned_weights[weight].double() - plain[weight].double(), 2)
        torch.testing.assert_close(delta, want, rtol=1e-4, atol=1e-6, msg=path)


def _module_changes(tensors) -> dict[str, torch.Tensor]:
    """file module -> ``alpha / r * up @ down`` as a float64 matrix, the module names found by
    the tensor names' ends (whatever the layout names modules by; peft's lora_A / lora_B are
    down and up at scale 1)."""
    tensors = unfold_peft(tensors)
    down = ".lora_down.weight"
    names = {key.removesuffix(down) for key in tensors if key.endswith(down)}
    out = {}
    for name in names:
        down = tensors[f"{name}.lora_down.weight"].double()
        up = tensors[f"{name}.lora_up.weight"].double()
        rank = down.shape[0]
        alpha = float(tensors[f"{name}.alpha"]) if f"{name}.alpha" in tensors else rank
        out[name] = alpha / rank * up.reshape(up.shape[0], -1) @ down.reshape(rank, -1)
    return out


@pytest.mark.parametrize("name", family_params())
def test_resize_is_the_truncated_svd_of_each_module(name, kit_folders, read_pipeline, tmp_path):
    """resize of our file (rank 4, alphas differing by block) to rank 2: every module's change
    is the best rank-2 approximation of the input's (plain torch's SVD), the names are the
    input's, and the trainer's import reads the file into rank-2 adapters."""
    folder = kit_folders(name)
    kit, modules, family, _, own = _own_file(read_pipeline, name, folder, tmp_path)
    out = tmp_path / "resized.safetensors"
    assert run_tool("resize", "--input", own, "--rank", 2, "--output", out) == 0
    before, after = _module_changes(read(own)[0]), _module_changes(read(out)[0])
    assert sorted(before) == sorted(after)
    for module, change in before.items():
        torch.testing.assert_close(after[module], _truncated(change, 2), rtol=1e-4, atol=1e-7)
    models = _adapters(kit, family, modules, 2)
    import_network_weights(family, models, read_network_weights(family, out), str(out))


def _adapters(kit, family, modules, rank: int):
    """kohya prefix -> a copy of each model our default LoRA adapts (``_own_file``'s layers),
    with fresh adapters of ``rank`` (convs too where the kit's LoRA has them)."""
    models = {UNET: copy.deepcopy(modules[denoiser_name(modules)])}
    pairs = zip(family.text_encoder_lora_prefixes, family.text_encoder_subfolders, strict=True)
    for index, (prefix, sub) in enumerate(pairs):
        if family.trains_text_encoder(index):
            models[prefix] = copy.deepcopy(modules[sub])
    conv = rank if kit.lora_conv else None
    spec = LoraSpec(rank, 1.0, conv_dim=conv, conv_alpha=None if conv is None else 1.0)
    for prefix, model in models.items():
        role = "unet" if prefix == UNET else "text_encoder"
        targets = family.adapter_targets(model, role, kit.lora_conv)
        if kit.diffusers_lora_skips is not None and prefix == UNET:
            targets = {p: k for p, k in targets.items() if not kit.diffusers_lora_skips(p)}
        apply_lora(model, targets, spec)
    return models
