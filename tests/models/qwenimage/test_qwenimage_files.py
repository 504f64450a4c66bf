"""Qwen-Image from Comfy-Org's single files, beyond the conformance suite's check of their own
layout: the other layouts users have (a prefixed transformer, a text encoder saved by current
transformers, a VAE in diffusers' names, no header) load to the folder's weights, an fp8-stored
transformer to its fp8 values, the sizes read off the released shapes are the released config,
and every wrong or missing file is refused by name before any weight is read."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_parts import empty_module
from library.models.families.name_table import CHECKPOINT_PREFIX
from library.models.families.qwenimage import shapes, spec
from library.models.families.qwenimage.load import load_qwenimage
from library.models.loader import load_components
from library.models.wan_vae_keys import vae_from_original
from tests.kits.qwenimage import tiny_shapes
from tests.kits.qwenimage.tiny_files import write_tiny_qwenimage_files
from tests.kits.scaled_fp8 import scaled


def _load(paths: dict, dtype=torch.float32, loader=load_qwenimage, **keys):
    model = {"pretrained_model_name_or_path": str(paths["transformer"]),
             "tokenizer_path": str(paths["tokenizer"]), "vae": str(paths["vae"])}  # fmt: skip
    flow = {"text_encoder": str(paths["text_encoder"])}
    for key, value in keys.items():
        (model if key in ModelSection.model_fields else flow)[key] = value
    model = {k: v for k, v in model.items() if v is not None}
    return loader(ModelSection(**model), FlowSection(**flow), dtype, dtype)


def _rewrite(path, edit, metadata: bool = True) -> None:
    """Rewrite a safetensors file through ``edit(tensors) -> tensors``, its header kept (or
    dropped)."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = edit(load_file(str(path)))
    save_file(tensors, str(path), metadata=meta if metadata else {"format": "pt"})


def _modules(parts) -> dict:
    return {"transformer": parts.denoiser, "vae": parts.vae, "text_encoder": parts.text_encoders[0]}


def _assert_same(a: torch.nn.Module, b: torch.nn.Module, cast=None) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for key, value in sb.items():
        assert torch.equal(sa[key], cast(value) if cast else value), key


def test_other_layouts_load_to_the_folders_weights(tmp_path, qwenimage_components):
    """A transformer under model.diffusion_model. without a header (its sizes read off the
    shapes, the rotary split guessed as the tiny model has it), Qwen2.5-VL in current
    transformers' names, the VAE in diffusers' names (a folder's vae/ file)."""
    paths = write_tiny_qwenimage_files(tmp_path, dtype=torch.float32,
                                       transformer_prefix=CHECKPOINT_PREFIX)  # fmt: skip
    _rewrite(paths["transformer"], lambda t: t, metadata=False)
    current = _modules(qwenimage_components)["text_encoder"].state_dict()
    _rewrite(paths["text_encoder"], lambda t: {k: v.clone() for k, v in current.items()})
    _rewrite(paths["vae"], lambda t: vae_from_original(t, tiny_shapes.tiny_vae_config()))
    parts = _load(paths)
    for name, module in _modules(parts).items():
        _assert_same(module, _modules(qwenimage_components)[name])
    assert parts.denoiser.config.axes_dims_rope == tuple(
        tiny_shapes.tiny_transformer_config()["axes_dims_rope"]
    )


def test_an_fp8_transformer_file_loads_its_fp8_values(tmp_path, qwenimage_components):
    """qwen_image_fp8_e4m3fn.safetensors: plain fp8 weights, cast to the weight dtype."""
    paths = write_tiny_qwenimage_files(tmp_path, dtype=torch.float32)
    _rewrite(paths["transformer"], lambda t: {k: v.to(torch.float8_e4m3fn) for k, v in t.items()})
    parts = _load(paths, torch.bfloat16)
    folder = _modules(qwenimage_components)["transformer"]
    _assert_same(parts.denoiser, folder, lambda v: v.to(torch.float8_e4m3fn).to(torch.bfloat16))


def test_the_released_shapes_give_the_released_transformer_config():
    from diffusers import QwenImageTransformer2DModel

    released = shapes.transformer_config()
    module = empty_module(lambda c: QwenImageTransformer2DModel(**c), released)
    found = spec.transformer_config({k: tuple(v.shape) for k, v in module.state_dict().items()})
    assert found == released


def test_component_files_replace_the_folders_parts(tmp_path, qwenimage_dir, qwenimage_components):
    """[flow] text_encoder and [model] vae with a diffusers folder: those files' weights (another
    seed), the folder's transformer."""
    other = write_tiny_qwenimage_files(tmp_path, seed=1, dtype=torch.float32)
    model = ModelSection(pretrained_model_name_or_path=str(qwenimage_dir), vae=str(other["vae"]))
    flow = FlowSection(text_encoder=str(other["text_encoder"]))
    parts = load_qwenimage(model, flow, torch.float32, torch.float32)
    alone = _load(other)
    _assert_same(parts.text_encoders[0], alone.text_encoders[0])
    _assert_same(parts.vae, alone.vae)
    _assert_same(parts.denoiser, qwenimage_components.denoiser)
    assert not torch.equal(
        parts.vae.decoder.conv_out.weight, qwenimage_components.vae.decoder.conv_out.weight
    )


@pytest.fixture
def paths(tmp_path):
    return write_tiny_qwenimage_files(tmp_path)


def test_missing_component_files_and_tokenizer_are_named(paths):
    with pytest.raises(ModelError, match=r'set text_encoder = "<path>" in \[flow\]'):
        _load(paths, text_encoder=None)
    with pytest.raises(ModelError, match=r'set vae = "<path>" in \[model\]'):
        _load(paths, vae=None)
    with pytest.raises(ModelError, match="carries no tokenizer: set tokenizer_path"):
        _load(paths, tokenizer_path=None)


def test_files_given_in_the_wrong_place_are_refused(paths):
    with pytest.raises(ModelError, match=r"^text_encoder = .*qwen_image_vae.safetensors is not"):
        _load(paths, text_encoder=str(paths["vae"]))
    with pytest.raises(ModelError, match=r"^vae = .*qwen_2.5_vl_7b.safetensors is not") as caught:
        _load(paths, vae=str(paths["text_encoder"]))
    assert "set vae in [model]" in str(caught.value)
    with pytest.raises(ModelError, match="holds no Qwen-Image transformer"):
        _load(paths, loader=files_loader, pretrained_model_name_or_path=str(paths["vae"]))


def files_loader(model, flow, weight_dtype, vae_dtype):
    """The single-file reader itself (the registry would not claim a VAE file as Qwen-Image)."""
    from library.models.families.spec_loader import load_spec

    return load_spec(spec.SPEC, model, flow, weight_dtype, vae_dtype)


@pytest.mark.parametrize(
    ("part", "key"),
    [
        ("transformer", "transformer_blocks.1.attn.to_k.weight"),
        ("text_encoder", "layers.2.mlp.up_proj.weight"),
        ("vae", "decoder.head.2.weight"),
    ],
)
def test_a_missing_or_misshapen_tensor_is_refused_by_name(tmp_path, part, key):
    """Dropped: the file is named as cut short (its header promises the tensor); reshaped: the
    tensor and both shapes are named. Found from the headers, before any weight is read."""
    for change in ("drop", "reshape"):
        paths = write_tiny_qwenimage_files(tmp_path / change)
        (name,) = [k for k in load_file(str(paths[part])) if k.endswith(key)]

        def edit(tensors, name=name, change=change):
            if change == "drop":
                del tensors[name]
            else:
                tensors[name] = torch.zeros(*tensors[name].shape[:-1], tensors[name].shape[-1] + 1)
            return tensors

        _rewrite(paths[part], edit)
        with pytest.raises(ModelError) as caught:
            _load(paths)
        message = str(caught.value)
        assert "\n" not in message and str(paths[part]) in message, message
        if change == "reshape":
            assert key.split(".", 1)[1] in message.replace("conv_out", "head.2"), message


def test_a_text_encoder_of_another_width_is_refused(paths, tmp_path):
    """Qwen2.5-VL's states must be as wide as the transformer's caption input: refused from
    the headers, naming both files and both widths."""
    from diffusers import QwenImageTransformer2DModel

    config = {**tiny_shapes.tiny_transformer_config(), "joint_attention_dim": 48}
    wider = tmp_path / "wider.safetensors"
    state = QwenImageTransformer2DModel(**config).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(wider),
              metadata={"format": "pt", "difftune.config.transformer": json.dumps(config)})  # fmt: skip
    with pytest.raises(ModelError, match=r"is 40 wide and the transformer of .* takes 48-wide"):
        _load(paths, loader=files_loader, pretrained_model_name_or_path=str(wider))


def test_a_scaled_fp8_text_encoder_is_its_dequantized_weights(paths, tmp_path):
    """qwen_2.5_vl_7b_fp8_scaled.safetensors' layout (the scaled_fp8 marker, scale_weight and
    scale_input beside each fp8 matrix) loads the text encoder of a file holding each matrix's
    fp8 values times its scale, computed here."""
    by_hand = tmp_path / "dequantized.safetensors"
    shutil.copy(paths["text_encoder"], by_hand)
    stored, want = scaled(load_file(str(paths["text_encoder"])), "scaled_fp8")
    _rewrite(by_hand, lambda t: want)
    _rewrite(paths["text_encoder"], lambda t: stored)
    got = _load(paths).text_encoders[0]
    _assert_same(got, _load(paths, text_encoder=str(by_hand)).text_encoders[0])


def test_the_model_version_must_fit_the_model(paths, qwenimage_dir):
    """A folder says its release; a file is an edit release's when model_version says so (and
    then needs the processor settings beside its tokenizer)."""
    model = ModelSection(pretrained_model_name_or_path=str(qwenimage_dir))
    with pytest.raises(ModelError, match='model_version = "edit" but .* QwenImagePipeline folder'):
        load_components(model, torch.float32, FlowSection(model_version="edit"))
    with pytest.raises(ModelError, match="has no preprocessor_config.json") as caught:
        _load(paths, loader=_through_registry, model_version="edit-2511")
    assert "tokenizer_path" in str(caught.value)


def _through_registry(model, flow, weight_dtype, vae_dtype):
    return load_components(model, weight_dtype, flow)


def test_2511_files_give_the_reference_tokens_the_zero_timestep(paths):
    """Qwen-Image-Edit-2511's transformer config has zero_cond_t, which its file does not
    carry: model_version says it."""
    from tests.kits.qwenimage_edit.tiny import write_tiny_processor

    write_tiny_processor(paths["tokenizer"])
    for version, zero in (("edit-2509", False), ("edit-2511", True)):
        parts = _load(paths, loader=_through_registry, model_version=version)
        assert parts.family.name == "qwenimage-edit-plus"
        assert parts.denoiser.config.zero_cond_t is zero
        assert len(parts.tokenizers) == 2  # the tokenizer and the processor
    header = json.loads(safe_open(str(paths["transformer"]), "pt").metadata()[
        "difftune.config.transformer"])  # fmt: skip
    assert "zero_cond_t" not in header


def as_transformers_5_processor(folder) -> None:
    """``folder``'s image processor settings as transformers 5 saves a processor: inside
    processor_config.json, with no preprocessor_config.json."""
    settings = folder / "preprocessor_config.json"
    image_processor = json.loads(settings.read_text(encoding="utf-8"))
    processor_class = image_processor.pop("processor_class")
    text = json.dumps({"image_processor": image_processor, "processor_class": processor_class})
    (folder / "processor_config.json").write_text(text, encoding="utf-8")
    settings.unlink()


def test_a_transformers_5_processor_folder_is_read(paths):
    """tokenizer_path may hold the image processor settings in processor_config.json (as
    transformers 5 saves a processor), as a diffusers folder's processor/ may."""
    from tests.kits.qwenimage_edit.tiny import IMAGE_PROCESSOR, write_tiny_processor

    as_transformers_5_processor(write_tiny_processor(paths["tokenizer"]))
    parts = _load(paths, loader=_through_registry, model_version="edit")
    image_processor = parts.tokenizers[1].image_processor
    for key in ("patch_size", "merge_size", "temporal_patch_size"):
        assert getattr(image_processor, key) == IMAGE_PROCESSOR[key], key
    assert list(image_processor.image_mean) == IMAGE_PROCESSOR["image_mean"]
    assert list(image_processor.image_std) == IMAGE_PROCESSOR["image_std"]

