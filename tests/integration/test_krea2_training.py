"""Krea 2 end to end through the CLI on the tiny Krea2Pipeline folder: a LoRA trains and its file
is what diffusers' Krea2Pipeline.load_lora_weights applies exactly (peft's tensors under the
original names, alpha folded in: base + up @ down); a full fine-tune from Krea's and ComfyUI's
single files writes the transformer in the original names, which reads back exactly."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from library.models.families.krea2.keys import TABLE
from tests.integration.harness import make_images, tensors, train, write_config
from tests.kits.krea2.tiny_files import write_tiny_krea2_files

KREA2 = {"network_module": "networks.lora_krea2", "bucket_reso_steps": 16,
         "max_train_steps": 2, "train_batch_size": 2}  # fmt: skip
PREFIX = "diffusion_model."


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = make_images(tmp_path_factory.mktemp("data") / "imgs", 2, size=64)
    (folder / "img01.txt").write_text("a much longer caption of shape number one on a gradient")
    return folder


def test_lora_trains_and_diffusers_applies_the_file(tmp_path, images, kit_folders):
    from diffusers import Krea2Pipeline

    folder = kit_folders("krea2", "raw")
    out = tmp_path / "out"
    assert train(write_config(tmp_path / "c.toml", folder, images, out, **KREA2)) == 0
    path = out / "run.safetensors"
    saved = tensors(path)
    assert all(k.startswith(PREFIX) and k.endswith(("lora_A.weight", "lora_B.weight"))
               for k in saved)  # fmt: skip
    assert f"{PREFIX}blocks.1.attn.wq.lora_A.weight" in saved
    assert f"{PREFIX}txtfusion.layerwise_blocks.0.mlp.gate.lora_B.weight" in saved
    assert any(v.abs().max() > 0 for k, v in saved.items() if k.endswith("lora_B.weight"))
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    assert meta["ss_network_module"] == "networks.lora_krea2"
    assert meta["modelspec.architecture"] == "Krea-2/lora"
    pipe = Krea2Pipeline.from_pretrained(folder, local_files_only=True)
    model = pipe.transformer
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    pipe.load_lora_weights(str(path))
    pipe.fuse_lora(components=["transformer"], lora_scale=1.0)
    fused = {n.replace(".base_layer", ""): p for n, p in model.named_parameters()}
    changed = 0
    for key, down in saved.items():
        if not key.endswith("lora_A.weight"):
            continue
        up = saved[key.replace("lora_A", "lora_B")]
        original = key[len(PREFIX) : -len(".lora_A.weight")]
        weight = next(iter(TABLE.from_original({original + ".weight": up})))
        expected = base[weight] + up.float() @ down.float()
        torch.testing.assert_close(fused[weight], expected, rtol=1e-5, atol=1e-6, msg=key)
        changed += 1
    assert changed == len(saved) // 2


def test_full_fine_tune_from_single_files_writes_a_file_that_reloads(tmp_path, images,
                                                                     monkeypatch):  # fmt: skip
    from library.config.flow_schema import FlowSection
    from library.config.schema import ModelSection
    from library.models.families.krea2.family import Krea2Family
    from library.models.families.krea2.load import load_krea2

    trained = {}
    real = Krea2Family.write_full_model

    def recording(self, path, denoiser, *args):
        trained.update({k: v.detach().clone() for k, v in denoiser.state_dict().items()})
        return real(self, path, denoiser, *args)

    monkeypatch.setattr(Krea2Family, "write_full_model", recording)
    files = write_tiny_krea2_files(tmp_path / "files", comfy=True)
    out = tmp_path / "out"
    components = {"tokenizer_path": str(files["tokenizer"]), "vae": str(files["vae"]),
                  "text_encoder": str(files["text_encoder"])}  # fmt: skip
    config = write_config(tmp_path / "c.toml", files["transformer"], images, out, **KREA2,
                          **components, train_mode="unet", learning_rate=1e-4,
                          save_precision="float")  # fmt: skip
    assert train(config) == 0
    saved = tensors(out / "run.safetensors")
    want = TABLE.to_original(trained)
    assert saved.keys() == want.keys()  # the original names, no prefix, the transformer alone
    assert all(torch.equal(saved[k], v) for k, v in want.items())
    model = ModelSection(pretrained_model_name_or_path=str(out / "run.safetensors"),
                         tokenizer_path=components["tokenizer_path"], vae=components["vae"])  # fmt: skip
    flow = FlowSection(text_encoder=components["text_encoder"])
    reloaded = load_krea2(model, flow, torch.float32, torch.float32).denoiser.state_dict()
    assert all(torch.equal(reloaded[k], v) for k, v in trained.items())
