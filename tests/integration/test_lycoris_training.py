"""LyCORIS adapters end to end through the CLI on the tiny SD 1.x and SDXL models.

The saved files are checked against LyCORIS' own package (``lycoris-lora``, the independent
reference): its network, built on the same models with the same network_args, has exactly our
module names and tensor shapes; its loader reads our file and merges the same weights that our
layers compute with. Then: network_weights reads the files back, accumulation and resume give
the same adapter as one batch and an uninterrupted run, and SDXL names follow the SGM layout.
"""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from safetensors import safe_open
from torch import nn

from tests.integration.harness import (
    check_accumulation_and_resume,
    make_images,
    tensors,
    train,
    write_config,
)

CASES = {
    # algo=loha with DoRA, 3x3 convs at their own rank, text encoder too
    "loha-dora": ["algo=loha", "conv_dim=2", "conv_alpha=1", "dora_wd=True"],
    # LoKr with a fixed factor, both sides decomposed and Tucker cores on convs; UNet only
    "lokr-tucker": ["algo=lokr", "factor=4", "decompose_both=True", "use_tucker=True"],
    # LoCon (algo=lora) on the transformer blocks only
    "locon-attn-mlp": ["algo=lora", "preset=attn-mlp"],
    # LoCon on everything the full preset adapts: conv_in, conv_out, time embedding, ResNets
    "locon-full": ["algo=locon", "conv_dim=2", "conv_alpha=1"],
}


@pytest.fixture(scope="module")
def tiny_sd1_components(tiny_model_dir):
    """The frozen float32 models of the tiny SD1 folder the runs train on."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    return {
        "unet": UNet2DConditionModel.from_pretrained(tiny_model_dir / "unet").eval(),
        "vae": AutoencoderKL.from_pretrained(tiny_model_dir / "vae").eval(),
        "text_encoder": CLIPTextModel.from_pretrained(tiny_model_dir / "text_encoder").eval(),
    }


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 4, size=64)


def _config(folder, model_dir, images, out, args, **keys):
    keys = {"network_module": "lycoris.kohya", "network_args": args, **keys}
    return write_config(folder / "c.toml", model_dir, images, out, **keys)


def _keyed_args(args: list[str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in args)


class _WithTextModel(nn.Module):
    """transformers 5's CLIPTextModel under transformers 4's ``text_model`` attribute, whose
    module paths LyCORIS (like kohya) names text-encoder modules by."""

    def __init__(self, clip):
        super().__init__()
        self.text_model = clip


@contextlib.contextmanager
def _sd_preset(name: str):
    """LyCORIS' preset ``name`` as it applies to sd-scripts' SD 1.x UNet, in force meanwhile.

    lycoris-lora 4.1.3 added TimestepEmbedding (for another model) to its class list while the
    full preset also names time_embedding.linear_1/2, so on an SD 1.x UNet it builds those twice
    and stops ("duplicated lora name"). The layers meant are the named ones."""
    import lycoris.kohya as lyco

    original = lyco.PRESET[name]
    preset = dict(original)
    preset["unet_target_module"] = [
        m for m in original["unet_target_module"] if m != "TimestepEmbedding"
    ]
    lyco.PRESET[name] = preset
    lyco.LycorisNetworkKohya.apply_preset(preset)
    try:
        yield
    finally:
        lyco.PRESET[name] = original
        lyco.LycorisNetworkKohya.apply_preset(lyco.PRESET["full"])


def _lycoris_network(components, args: dict[str, str], with_text: bool):
    import lycoris.kohya as lyco

    text = _WithTextModel(components["text_encoder"]) if with_text else None
    with _sd_preset(args.get("preset", "full")):
        return lyco.create_network(1.0, 4, 2.0, components["vae"], text, components["unet"], **args)


def _shapes(path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path), framework="pt") as handle:
        return {k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()}  # noqa: SIM118


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir, images):
    """case -> the file a 2-step run of that case wrote."""
    files = {}
    for case, args in CASES.items():
        folder = tmp_path_factory.mktemp(case)
        unet_only = case == "lokr-tucker"
        config = _config(folder, tiny_model_dir, images, folder / "out", args,
                         max_train_steps=2, network_train_unet_only=unet_only)  # fmt: skip
        assert train(config) == 0
        files[case] = folder / "out" / "run.safetensors"
    return files


@pytest.mark.parametrize("case", list(CASES))
def test_keys_and_shapes_are_lycoris_own(trained, tiny_sd1_components, case):
    """LyCORIS' network on the same models with the same args holds the same tensors."""
    args = _keyed_args(CASES[case])
    components = {k: copy.deepcopy(v) for k, v in tiny_sd1_components.items()}
    network = _lycoris_network(components, args, with_text=case != "lokr-tucker")
    expected = {}
    for module in network.unet_loras + network.text_encoder_loras:
        for key, tensor in module.state_dict().items():
            expected[f"{module.lora_name}.{key}"] = tuple(tensor.shape)
    ours = _shapes(trained[case])
    assert {k: ours.get(k) for k in expected} == expected
    assert set(ours) == set(expected)


@pytest.mark.parametrize("case", list(CASES))
def test_lycoris_loader_computes_what_our_layers_compute(trained, tiny_sd1_components, case):
    """LyCORIS' own loader reads our file into fresh models; with its adapters applied, the UNet
    and text encoder give the outputs of our layers loaded from the same file, and of our
    layers merged into plain weights (and the adapters trained: outputs moved from the base).

    Outputs, not LyCORIS' merge: lycoris-lora 4.1.3's merge_to applies the scale of LoHa and
    LoKr twice (its forward, functional API and ComfyUI apply it once)."""
    import lycoris.kohya as lyco

    path = trained[case]
    theirs = {k: copy.deepcopy(v) for k, v in tiny_sd1_components.items()}
    text = _WithTextModel(theirs["text_encoder"])
    if case == "lokr-tucker":
        # LyCORIS' loader takes a Tucker LoKr's rank from the wrong axis and cannot build it;
        # its network, built from the same network_args, reads the file's tensors instead.
        network = _lycoris_network(theirs, _keyed_args(CASES[case]), with_text=False)
        text = None
        saved = tensors(path)
        for module in network.unet_loras:
            module.load_state_dict(
                {
                    k.split(".", 1)[1]: v
                    for k, v in saved.items()
                    if k.split(".")[0] == module.lora_name
                }  # fmt: skip
            )
    else:
        with _sd_preset("full"):
            network, _ = lyco.create_network_from_weights(
                1.0, str(path), theirs["vae"], text, theirs["unet"]
            )
    network.apply_to(text, theirs["unet"], text is not None, True)
    ours = _our_models(tiny_sd1_components, path, CASES[case])
    merged = _merged_plain(tiny_sd1_components, ours)

    gen = torch.Generator().manual_seed(3)
    latents = torch.randn(2, 4, 8, 8, generator=gen)
    steps = torch.tensor([10, 600])
    ids = torch.randint(0, 500, (2, 77), generator=gen)
    with torch.no_grad():
        context = tiny_sd1_components["text_encoder"](ids)[0]
        outputs = {}
        for name, models in (("lycoris", theirs), ("ours", ours), ("merged", merged)):
            outputs[name] = (
                models["text_encoder"](ids)[0],
                models["unet"](latents, steps, context).sample,
            )
        base = tiny_sd1_components["unet"](latents, steps, context).sample
    for name in ("ours", "merged"):
        for got, want in zip(outputs[name], outputs["lycoris"], strict=True):
            assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), name
    assert (outputs["lycoris"][1] - base).abs().max() > 1e-4


def _merged_plain(components, ours):
    """Plain copies of the models with each of our layers' merged weight written in."""
    from library.networks.adapters import lycoris_layers

    plain = {}
    for role in ("unet", "text_encoder"):
        model = copy.deepcopy(components[role])
        layers = lycoris_layers(ours[role])
        with torch.no_grad():
            for layer_path, layer in layers.items():
                model.get_submodule(layer_path).weight.copy_(layer.merged_weight())
        plain[role] = model
    return plain


def _our_models(components, path, args):
    """Fresh copies of the tiny SD1 UNet and text encoder with our LyCORIS layers, loaded from
    ``path`` through the trainer's own import."""
    from library.config import kohya
    from library.config.schema import Config
    from library.models.families.sd.family import SD1
    from library.training.adapter_setup import adapter_settings, inject

    parsed = kohya.network_args_values(args)
    network = {"network_module": "lycoris.kohya", "network_dim": 4, "network_alpha": 2.0}
    for key in ("conv_dim", "conv_alpha"):
        if key in parsed:
            network[key] = parsed.pop(key)
    config = Config(
        model={"pretrained_model_name_or_path": "unused"},
        network=network,
        adapter=parsed,
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )
    settings = adapter_settings(config)
    models = {"unet": copy.deepcopy(components["unet"]),
              "text_encoder": copy.deepcopy(components["text_encoder"])}  # fmt: skip
    with safe_open(str(path), framework="pt") as handle:
        has_text = any(k.startswith("lora_te_") for k in handle.keys())  # noqa: SIM118
    lora_models = {"lora_unet": models["unet"]}
    inject(SD1, models["unet"], "unet", settings)
    if has_text:
        inject(SD1, models["text_encoder"], "text_encoder", settings)
        lora_models["lora_te"] = models["text_encoder"]
    SD1.load_lora_tensors(lora_models, tensors(path), str(path))
    return models


def test_network_weights_reads_the_file_back(trained, tmp_path, tiny_model_dir, images):
    """A run started from a LoHa file holds exactly its tensors before the first step (0 steps
    of training: learning rate 0)."""
    path = trained["loha-dora"]
    out = tmp_path / "out"
    config = _config(tmp_path, tiny_model_dir, images, out, CASES["loha-dora"],
                     max_train_steps=1, learning_rate=0.0, network_weights=str(path))  # fmt: skip
    assert train(config) == 0
    saved, original = tensors(out / "run.safetensors"), tensors(path)
    assert saved.keys() == original.keys()
    for key, value in original.items():
        assert torch.equal(saved[key], value), key


def test_network_weights_of_another_algorithm_is_refused(trained, tmp_path, tiny_model_dir,
                                                         images, capsys):  # fmt: skip
    out = tmp_path / "out"
    config = _config(tmp_path, tiny_model_dir, images, out, ["algo=lokr"],
                     max_train_steps=1, network_weights=str(trained["loha-dora"]))  # fmt: skip
    assert train(config) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and 'set network_args "algo=loha"' in err[0], err


@pytest.mark.parametrize("case", ["loha-dora", "lokr-tucker"])
def test_accumulation_and_resume(tmp_path, tiny_model_dir, images, monkeypatch, case):
    def make(folder, out, **keys):
        return _config(folder, tiny_model_dir, images, out, CASES[case], **keys)

    common = {"max_train_steps": 2, "train_batch_size": 4, "optimizer_args": ["eps=1e-3"],
              "scale_weight_norms": 1e-4, "network_train_unet_only": case == "lokr-tucker"}  # fmt: skip
    check_accumulation_and_resume(tmp_path, make, common, monkeypatch)


def test_sdxl_names_follow_the_sgm_layout(tmp_path, tiny_sdxl_model_dir, images):
    out = tmp_path / "out"
    config = _config(tmp_path, tiny_sdxl_model_dir, images, out, ["algo=loha", "conv_dim=2"],
                     max_train_steps=1)  # fmt: skip
    assert train(config) == 0
    names = {k.split(".")[0] for k in _shapes(out / "run.safetensors")}
    unet = {n for n in names if n.startswith("lora_unet_")}
    assert unet and all(
        n.startswith(("lora_unet_input_blocks_", "lora_unet_middle_block_",
                      "lora_unet_output_blocks_")) for n in unet
    )  # fmt: skip
    # sd-scripts' SDXL UNet does not call its first conv conv_in, so LyCORIS leaves it alone
    assert "lora_unet_input_blocks_0_0" not in names
    assert any(n.startswith("lora_te1_") for n in names) and any(
        n.startswith("lora_te2_") for n in names
    )


# -- FLUX.1 and SD3: one LyCORIS layer per (fused) original layer ---------------------------------

FLOW = {
    "bucket_reso_steps": 16,
    "network_module": "lycoris.kohya",
}


@pytest.fixture(scope="module")
def flux_dir(kit_folders):
    """The session's tiny kit folder (flux dev, seed 0): read only."""
    return kit_folders("flux", "dev")


@pytest.fixture(scope="module")
def sd3_dir(kit_folders):
    """The session's tiny kit folder (sd3 sd3.5-medium, seed 0): read only."""
    return kit_folders("sd3", "sd3.5-medium")


def _flow_config(folder, model_dir, images, out, args, **keys):
    flux = "flux" in str(model_dir)
    family = {"timestep_sampling": "shift", "guidance_scale": 1.0} if flux else {}
    return write_config(folder / "c.toml", model_dir, images, out, resolution=64,
                        network_args=args, **{**FLOW, **family, **keys})  # fmt: skip


@pytest.mark.parametrize("model", ["flux", "sd3"])
def test_transformer_files_name_the_original_layers(model, tmp_path, flux_dir, sd3_dir, images):
    """A LoKr run on the transformer and the CLIPs: the file holds one module per original
    (fused) layer, LoKr's tensors, the CLIPs' modules, and reads back as network_weights."""
    from library.models.families.flux.family import FLUX_DEV
    from library.models.families.sd3.family import sd3_family

    model_dir = flux_dir if model == "flux" else sd3_dir
    args = ["algo=lokr", "factor=4", "dora_wd=True"]
    out = tmp_path / "out"
    assert train(_flow_config(tmp_path, model_dir, images, out, args, max_train_steps=2)) == 0
    saved = tensors(out / "run.safetensors")
    names = {k.split(".")[0] for k in saved}
    if model == "flux":
        from diffusers import FluxTransformer2DModel

        family = FLUX_DEV
        transformer = FluxTransformer2DModel.from_pretrained(model_dir / "transformer")
        assert "lora_unet_double_blocks_0_img_attn_qkv" in names
        assert "lora_unet_single_blocks_0_linear1" in names
    else:
        from diffusers import SD3Transformer2DModel

        from library.config.flow_schema import FlowSection

        family = sd3_family("sd3.5-medium", FlowSection())
        transformer = SD3Transformer2DModel.from_pretrained(model_dir / "transformer")
        assert {"lora_unet_joint_blocks_0_x_block_attn_qkv", "lora_unet_x_embedder_proj"} <= names
    expected = {m.name for m in family.lycoris_modules(transformer, "full")}
    assert {n for n in names if n.startswith("lora_unet_")} == expected
    assert any(n.startswith("lora_te1_") for n in names)
    assert any(k.endswith(".lokr_w1") for k in saved) and any(k.endswith(".dora_scale") for k in saved)

    again = tmp_path / "again"
    (tmp_path / "b").mkdir()
    config = _flow_config(tmp_path / "b", model_dir, images, again, args, max_train_steps=1,
                          learning_rate=0.0, network_weights=str(out / "run.safetensors"))  # fmt: skip
    assert train(config) == 0
    reread = tensors(again / "run.safetensors")
    assert reread.keys() == saved.keys() and all(torch.equal(reread[k], saved[k]) for k in saved)


def test_transformer_accumulation_and_resume(tmp_path, sd3_dir, images, monkeypatch):
    def make(folder, out, **keys):
        return _flow_config(folder, sd3_dir, images, out, ["algo=loha", "use_tucker=True"], **keys)

    common = {"max_train_steps": 2, "train_batch_size": 4, "optimizer_args": ["eps=1e-3"],
              "network_train_unet_only": True, "scale_weight_norms": 1e-4}  # fmt: skip
    check_accumulation_and_resume(tmp_path, make, common, monkeypatch)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["algo=loha", "train_t5xxl=True"], "train_t5xxl: LyCORIS adapts no T5-XXL layer"),
        (["algo=loha", "preset=attn-only"], "preset = attn-only adapts no layer of SD3's"),
        (["algo=loha", "split_qkv=True"], "split_qkv is an argument of kohya's networks.lora_flux"),
    ],
)
def test_transformer_refusals(tmp_path, sd3_dir, images, capsys, args, expected):
    config = _flow_config(tmp_path, sd3_dir, images, tmp_path / "out", args, max_train_steps=1)
    assert train(config) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and expected in err[0], err


def test_diffusers_reads_every_key_of_a_locon_file(trained, tiny_model_dir, capsys):
    """diffusers' own load_lora_weights (run by lora_tool.py check) consumes every key of a
    LyCORIS LoCon file, conv_in, conv_out and the time embedding included. (It drops DoRA's
    dora_scale with a warning, and reads no LoHa/LoKr for SD: ComfyUI does.)"""
    from library.lora_tools.cli import main

    code = main(["check", "--lora", str(trained["locon-full"]), "--model", str(tiny_model_dir),
                 "--loader", "diffusers"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "reads all" in out
