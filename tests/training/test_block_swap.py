"""blocks_to_swap: the frozen weights of the transformer's last blocks live in host memory and
are fetched per use; training with them swapped gives the weights training without gives."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from library.models.float8 import store_in_float8
from library.training.block_swap import HostLinear, swap_linears
from tests.integration.harness import make_images, tensors, train, write_config
from tests.integration.test_flux_training import FLUX
from tests.integration.test_sd3_training import SD3
from tests.kits.flux.tiny_files import write_tiny_flux_folder
from tests.kits.sd3.tiny_files import write_tiny_sd3_folder


def _pair(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    plain = nn.Linear(8, 5).to(dtype).requires_grad_(False)
    swapped = nn.Sequential(nn.Linear(8, 5).to(dtype))
    swapped[0].load_state_dict(plain.state_dict())
    swapped.requires_grad_(False)
    assert swap_linears([swapped]) == 1
    return plain, swapped


@pytest.mark.parametrize("autocast", [False, True])
def test_host_linear_computes_what_the_linear_computes(autocast):
    plain, swapped = _pair(dtype=torch.bfloat16 if autocast else torch.float32)
    assert isinstance(swapped[0], HostLinear) and list(swapped.parameters()) == []
    x = torch.randn(3, 8, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y, y2 = plain(x), swapped(x2)
    torch.testing.assert_close(y2, y, rtol=0, atol=0)
    grad = torch.randn_like(y)
    y.backward(grad)
    y2.backward(grad)
    torch.testing.assert_close(x2.grad, x.grad, rtol=0, atol=0)


def test_float8_stored_weights_keep_their_float8_arithmetic():
    plain, swapped = _pair()
    holder = nn.Sequential(plain)
    store_in_float8(holder, torch.bfloat16)  # fp8_base: a Float8Linear computing in bf16
    store_in_float8(swapped, torch.bfloat16)  # (already a HostLinear: left as it is)
    fresh = nn.Sequential(nn.Linear(8, 5))
    fresh[0].load_state_dict(_pair()[0].state_dict())
    fresh.requires_grad_(False)
    store_in_float8(fresh, torch.bfloat16)
    assert swap_linears([fresh]) == 1  # the Float8Linear becomes a HostLinear, still float8
    assert fresh[0].host_weight.dtype == torch.float8_e4m3fn
    x = torch.randn(3, 8, dtype=torch.bfloat16, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y2 = holder(x), fresh(x2)
    torch.testing.assert_close(y2, y, rtol=0, atol=0)
    y.float().sum().backward()
    y2.float().sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=0, atol=0)


def test_trained_linears_are_never_swapped():
    block = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    block[1].requires_grad_(False)
    assert swap_linears([block]) == 1
    assert type(block[0]) is nn.Linear and isinstance(block[1], HostLinear)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"flux": write_tiny_flux_folder(root / "flux", "dev", seed=0),
            "sd3": write_tiny_sd3_folder(root / "sd3", seed=0)}  # fmt: skip


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("data") / "imgs", 4, size=64)


def _train(tmp_path, model, images, family_keys, **keys):
    out = tmp_path / f"out-{keys.get('blocks_to_swap', 0)}"
    config = write_config(tmp_path / "c.toml", model, images, out, resolution=64,
                          max_train_steps=2, optimizer_args=["eps=1e-3"],
                          **{**family_keys, **keys})  # fmt: skip
    assert train(config) == 0
    return tensors(out / "run.safetensors")


@pytest.mark.integration
@pytest.mark.parametrize(("family", "keys", "count"), [("flux", FLUX, 2), ("sd3", SD3, 2)])
def test_training_with_swapped_blocks_gives_the_same_lora(tmp_path, models, images, family,
                                                          keys, count):  # fmt: skip
    plain = _train(tmp_path, models[family], images, keys)
    swapped = _train(tmp_path, models[family], images, keys, blocks_to_swap=count,
                     gradient_checkpointing=True)  # fmt: skip
    assert plain.keys() == swapped.keys()
    ups = [k for k in plain if k.endswith("lora_up.weight")]
    assert any(plain[k].abs().max() > 0 for k in ups)  # it trained
    for key in plain:
        torch.testing.assert_close(swapped[key], plain[key], rtol=1e-5, atol=1e-7)


def test_the_swapped_blocks_follow_kohyas_split(models):
    from library.config.schema import Config
    from library.models.loader import load_components
    from library.training.setup import setup_training

    def setup(model, count, **keys):
        config = Config(
            model={"pretrained_model_name_or_path": str(model)},
            network={"network_train_unet_only": True, **keys},
            optimizer={"learning_rate": 1e-4},
            training={"blocks_to_swap": count},
            datasets=[{"subsets": [{"image_dir": "unused"}]}],
        )
        return setup_training(config, load_components(config.model, torch.float32))

    def swapped(block):
        return any(isinstance(m, HostLinear) for m in block.modules())

    # 3 blocks: 1 double block and 4 single blocks in kohya's split; the tiny model has 2 + 2
    with pytest.raises(Exception, match="would swap 4 single blocks, and the model has 2"):
        setup(models["flux"], 3, network_module="networks.lora_flux")
    parts = setup(models["flux"], 2, network_module="networks.lora_flux")  # 1 double, 2 single
    flux = parts.components.denoiser
    assert [swapped(b) for b in flux.transformer_blocks] == [False, True]
    assert [swapped(b) for b in flux.single_transformer_blocks] == [True, True]
    for block in [flux.transformer_blocks[1], *flux.single_transformer_blocks]:
        linears = [m for n, m in block.named_modules()
                   if isinstance(m, nn.Linear) and "lora_" not in n]  # fmt: skip
        assert linears and all(isinstance(m, HostLinear) for m in linears)
        assert all(m.host_weight.device.type == "cpu" for m in linears)
        frozen = [n for n, p in block.named_parameters() if not p.requires_grad]
        assert all("norm" in n for n in frozen), frozen  # only the norms' scales stay
        assert any(p.requires_grad for p in block.parameters())  # the LoRA trains there
    assert not any(isinstance(m, HostLinear) for m in flux.transformer_blocks[0].modules())


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"train_mode": "unet"}, 'with train_mode = "unet" every weight trains'),
        ({"network_module": "lycoris.kohya"}, "does not work with LyCORIS adapters yet"),
    ],
)
def test_what_block_swap_cannot_do_is_refused_by_the_config(keys, message):
    from library.config.schema import Config

    with pytest.raises(ValueError, match=message):
        Config(
            model={"pretrained_model_name_or_path": "unused"},
            network=keys,
            optimizer={"learning_rate": 1e-4},
            training={"blocks_to_swap": 2},
            datasets=[{"subsets": [{"image_dir": "unused"}]}],
        )


def test_block_swap_on_an_sd_model_names_the_families_it_is_for(tiny_model_dir):
    from library.config.schema import Config
    from library.errors import ConfigError
    from library.models.loader import load_components
    from library.training.setup import setup_training

    config = Config(
        model={"pretrained_model_name_or_path": str(tiny_model_dir)},
        optimizer={"learning_rate": 1e-4},
        training={"blocks_to_swap": 2},
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )
    with pytest.raises(ConfigError, match="sd1's denoiser has no blocks to swap"):
        setup_training(config, load_components(config.model, torch.float32))


def test_the_memory_estimate_copies_no_host_weight():
    from library.training.activation_memory import meta_copy

    _, swapped = _pair()
    copied = meta_copy(swapped, torch.bfloat16)
    assert copied[0].host_weight.device.type == "meta"  # not a second host copy
    assert swapped[0].host_weight.device.type == "cpu"  # the original is untouched
    assert copied(torch.empty(2, 8, device="meta", dtype=torch.bfloat16)).shape == (2, 5)
