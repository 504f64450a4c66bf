"""What the shared loader derives from a family spec without reading weights: which layout and
prefix a main file's keys show, which files a spec claims, and how an unset, missing or
folder component file is refused by its key (Chroma's spec as the example)."""

from __future__ import annotations

import re

import pytest

from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.chroma.original_keys import TABLE
from library.models.families.chroma.spec import SPEC
from library.models.families.spec import MainFile
from library.models.families.spec_loader import (
    claims,
    folder_of,
    plan_component,
    plan_main,
    spec_for,
)

MAIN = MainFile(
    names=TABLE,
    original_marks=("refiner.",),
    diffusers_marks=("refiner.", "all_in.weight"),
    config_from_shapes=dict,
    damaged=re.compile("refiner"),
    example="x.safetensors",
)


def test_layout_and_prefix_from_the_marks():
    assert MAIN.detect(["refiner.0.w", "all_in.weight"]) == ("diffusers", "")
    assert MAIN.detect(["model.diffusion_model.refiner.0.w"]) == (
        "original",
        "model.diffusion_model.",
    )
    assert MAIN.detect(["other.weight"]) is None


def test_the_folder_is_derived_from_the_spec():
    folder = folder_of(SPEC)
    assert folder.pipeline == "ChromaPipeline"
    assert [(p.sub, p.cls, p.file_key, p.vae) for p in folder.parts] == [
        ("transformer", "diffusers:ChromaTransformer2DModel", None, False),
        ("vae", "diffusers:AutoencoderKL", "ae", True),
        ("text_encoder", "transformers:T5EncoderModel", "t5xxl", False),
    ]


def test_claims_by_keys(tmp_path):
    import torch
    from safetensors.torch import save_file

    path = tmp_path / "chroma.safetensors"
    save_file({"distilled_guidance_layer.in_proj.weight": torch.zeros(1),
               "double_blocks.0.img_attn.qkv.weight": torch.zeros(1)}, str(path))  # fmt: skip
    assert claims(SPEC, ModelSection(pretrained_model_name_or_path=str(path)))
    other = tmp_path / "other.safetensors"
    save_file({"double_blocks.0.img_attn.qkv.weight": torch.zeros(1)}, str(other))
    assert not claims(SPEC, ModelSection(pretrained_model_name_or_path=str(other)))


def test_a_files_spec_is_the_one_its_keys_hold_by_the_most_marks(tmp_path):
    """Two releases of one family told apart by a file's keys (one adds an input): each file
    gets its own spec whichever order the specs are given in; a file of neither the first."""
    import dataclasses

    import torch
    from safetensors.torch import save_file

    extra = dataclasses.replace(MAIN, original_marks=("refiner.", "guide.weight"))
    plain, guided = SPEC, dataclasses.replace(SPEC, pipeline="GuidedPipeline")
    guided = dataclasses.replace(guided, parts=(
        dataclasses.replace(guided.parts[0], main=extra), *guided.parts[1:]))  # fmt: skip
    plain = dataclasses.replace(plain, parts=(
        dataclasses.replace(plain.parts[0], main=MAIN), *plain.parts[1:]))  # fmt: skip

    def spec_of(keys, specs):
        path = tmp_path / f"{len(keys)}.safetensors"
        save_file({key: torch.zeros(1) for key in keys}, str(path))
        return spec_for(specs, ModelSection(pretrained_model_name_or_path=str(path)))

    for specs in ((plain, guided), (guided, plain)):
        assert spec_of(["refiner.0.w", "guide.weight"], specs) is guided
        assert spec_of(["refiner.0.w"], specs) is plain
        assert spec_of(["other.weight", "x", "y"], specs) is specs[0]


def test_component_files_are_refused_by_key(tmp_path):
    part = SPEC.part("text_encoder")
    with pytest.raises(ModelError, match=r'needs the T5-XXL .*set t5xxl = "<path>" in \[flow\]'):
        plan_component(SPEC, part, None)
    with pytest.raises(ModelError, match=f"t5xxl = {re.escape(str(tmp_path))} is a folder"):
        plan_component(SPEC, part, str(tmp_path))
    missing = tmp_path / "t5.safetensors"
    with pytest.raises(ModelError, match=f"t5xxl = {re.escape(str(missing))} is not a file"):
        plan_component(SPEC, part, str(missing))


def test_a_component_may_be_a_folder_of_the_parts_class(tmp_path):
    """With ``folders``, a component key naming a diffusers folder reads the part's class from
    it (the folder itself, or its subfolder of the part's name); another value that is no
    .safetensors file is refused by the key."""
    import dataclasses

    import torch
    from diffusers import AutoencoderKL

    part = SPEC.part("vae")
    part = dataclasses.replace(part, file=dataclasses.replace(part.file, folders=True))
    vae = AutoencoderKL(block_out_channels=(8,), norm_num_groups=4, latent_channels=4)
    vae.save_pretrained(tmp_path / "pipe" / "vae")
    for value in (tmp_path / "pipe", tmp_path / "pipe" / "vae"):
        loaded = plan_component(SPEC, part, str(value))(torch.float32)
        assert type(loaded) is AutoencoderKL
        assert all(torch.equal(v, vae.state_dict()[k]) for k, v in loaded.state_dict().items())
    with pytest.raises(ModelError, match=r"ae = .*vae\.ckpt: set ae in \[flow\] to "):
        plan_component(SPEC, part, str(tmp_path / "vae.ckpt"))


def test_a_main_file_in_an_unread_quantization_is_refused_naming_the_released_file(tmp_path):
    """A layer ComfyUI describes in a format difftune does not read (mxfp8's block scales) is
    refused before any weight is read, naming the key, the released file and a folder."""
    import torch
    from safetensors.torch import save_file

    from tests.kits.scaled_fp8 import description

    path = tmp_path / "model_mxfp8.safetensors"
    layer = "double_blocks.0.img_attn.qkv"
    save_file({f"{layer}.weight": torch.zeros(4, 4, dtype=torch.float8_e4m3fn),
               f"{layer}.weight_scale": torch.ones(4, 1, dtype=torch.uint8),
               f"{layer}.comfy_quant": description("mxfp8")}, str(path))  # fmt: skip
    with pytest.raises(ModelError) as info:
        plan_main(SPEC, CheckpointFile(path))
    message = str(info.value)
    assert message.startswith(
        f"pretrained_model_name_or_path = {path}: {layer}.comfy_quant stores {layer} as 'mxfp8'"
    )
    assert f"({SPEC.main.example}) or a diffusers folder" in message and "\n" not in message


def test_a_component_may_be_inside_the_main_file(tmp_path):
    """With ``inside``, an unset key reads the part from the main file when it holds one, and
    is refused naming the main file and the key when it does not; a set key wins."""
    import dataclasses

    import torch
    from safetensors.torch import save_file

    from library.models.checkpoint_file import CheckpointFile

    part = SPEC.part("text_encoder")
    inner = object()
    declared = dataclasses.replace(
        part.file, inside=lambda file: inner if "t5.shared.weight" in file else None
    )
    part = dataclasses.replace(part, file=declared)
    holding, bare = tmp_path / "full.safetensors", tmp_path / "bare.safetensors"
    save_file({"t5.shared.weight": torch.zeros(1)}, str(holding))
    save_file({"other.weight": torch.zeros(1)}, str(bare))
    assert plan_component(SPEC, part, None, CheckpointFile(holding)) is inner
    refused = r'bare.safetensors does not hold the T5-XXL .*set t5xxl = "<path>" in \[flow\]'
    with pytest.raises(ModelError, match=refused):
        plan_component(SPEC, part, None, CheckpointFile(bare))
    missing = tmp_path / "t5.safetensors"
    with pytest.raises(ModelError, match="is not a file"):
        plan_component(SPEC, part, str(missing), CheckpointFile(holding))
