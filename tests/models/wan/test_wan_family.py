"""What is only Wan's: umT5 captions as the pipelines make them, musubi-tuner's task checked
against the transformer, and image-to-video transformers refused by name (the properties every
family has are the conformance suite's: tests/kits/wan/kit.py)."""

from __future__ import annotations

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.families.wan.family import load_wan
from library.models.families.wan.keys import TABLE, TABLE_CLIP
from tests.kits.wan.tiny import transformer_config
from tests.kits.wan.tiny_files import write_tiny_wan_files, write_tiny_wan_t5_pth


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_tiny_wan_files(tmp_path_factory.mktemp("models") / "wan")


def _load(files, transformer=None, **flow):
    model = ModelSection(pretrained_model_name_or_path=str(transformer or files["transformer"]),
                         vae=str(files["vae"]))  # fmt: skip
    flow = FlowSection(t5=str(files["t5"]), t5_tokenizer_path=str(files["tokenizer"]), **flow)
    return load_wan(model, flow, torch.float32, torch.float32)


def test_caption_states_are_the_pipelines_prompt_embeds(kit_folders):
    """Cleaned (HTML entities, runs of whitespace), 512 tokens, zero past each caption: as
    WanPipeline.encode_prompt gives them, padded back from the cache's own lengths."""
    from diffusers import WanPipeline

    folder = kit_folders("wan", "t2v")
    pipe = WanPipeline.from_pretrained(folder, local_files_only=True)
    captions = ["a  red &amp; blue\ncube ", "x"]
    with torch.no_grad():  # as the pipeline's call runs it
        theirs, _ = pipe.encode_prompt(captions, do_classifier_free_guidance=False,
                                       max_sequence_length=512, device=torch.device("cpu"))  # fmt: skip
    components = load_wan(ModelSection(pretrained_model_name_or_path=str(folder)), FlowSection(),
                          torch.float32, torch.float32)  # fmt: skip
    family = components.family
    text = family.encode_text(components.tokenizers, components.text_encoders, captions, "cpu")
    assert text.lengths.tolist() == [int(n) for n in (theirs.abs().sum(-1) > 0).sum(-1)]
    cut = type(text)(text.hidden[:, : int(text.lengths.max())], None, None, text.lengths)
    ours = family.assemble_conditioning(cut, None, "cpu").encoder_hidden_states
    assert ours.shape == theirs.shape == (2, 512, 32)
    assert torch.equal(ours, theirs)


def test_t5_may_be_wan_ais_pth(files, tmp_path):
    """[flow] t5 names Wan-AI's models_t5_umt5-xxl-enc-bf16.pth (Wan's own names, a torch
    file): the same encoder as the safetensors file's, tensor for tensor."""
    pth = write_tiny_wan_t5_pth(tmp_path / "models_t5_umt5-xxl-enc-bf16.pth", dtype=torch.float32)
    model = ModelSection(pretrained_model_name_or_path=str(files["transformer"]),
                         vae=str(files["vae"]))  # fmt: skip
    flow = {"t5_tokenizer_path": str(files["tokenizer"])}
    from_pth = load_wan(model, FlowSection(t5=str(pth), **flow), torch.float32, torch.float32)
    plain = _load(files).text_encoders[0].state_dict()
    loaded = from_pth.text_encoders[0].state_dict()
    assert loaded.keys() == plain.keys()
    assert all(torch.equal(loaded[k], plain[k]) for k in plain)


def test_task_must_be_the_transformers(files):
    with pytest.raises(ModelError, match=r"task = 't2v-14B' is a 5120-wide .* set task to none"):
        _load(files, task="t2v-14B")
    assert _load(files).denoiser.config.num_layers == 2


def test_a_umt5_file_of_another_width_is_refused(files, tmp_path):
    """umT5's states must be as wide as the transformer's text input: refused from the headers,
    naming the file and both widths."""
    from transformers import UMT5Config, UMT5EncoderModel

    from tests.kits.krea2.tiny_files import _save
    from tests.kits.wan.tiny import text_encoder_config

    config = {**text_encoder_config(), "d_model": 24}
    wide = UMT5EncoderModel(UMT5Config(**config)).state_dict()
    wide.pop("encoder.embed_tokens.weight")
    path = _save(wide, tmp_path / "umt5_24.safetensors", torch.float32, config, "text_encoder")
    with pytest.raises(ModelError, match=r"gives 24-wide umT5 states .* reads 32-wide ones") as e:
        _load({**files, "t5": path})
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_the_image_input_has_its_original_names():
    """Wan 2.1 I2V-14B's transformer: the T2V keys and the image input's (cross_attn.k_img /
    v_img / norm_k_img, the image embedding img_emb.proj.0-4, spelled here from Wan-AI's
    model.py), as diffusers' single-file converter reads them back."""
    from diffusers import WanTransformer3DModel
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    model = WanTransformer3DModel(**{**transformer_config(), "in_channels": 36,
                                     "image_dim": 24, "added_kv_proj_dim": 16})  # fmt: skip
    state = model.state_dict()
    original = {}
    for key, value in state.items():
        try:
            original[TABLE.original_key(key)] = value
        except ValueError:  # the image input, in the original names
            for theirs, name in ((".attn2.add_k_proj.", ".cross_attn.k_img."),
                                 (".attn2.add_v_proj.", ".cross_attn.v_img."),
                                 (".attn2.norm_added_k.", ".cross_attn.norm_k_img."),
                                 ("condition_embedder.image_embedder.norm1", "img_emb.proj.0"),
                                 ("condition_embedder.image_embedder.ff.net.0.proj",
                                  "img_emb.proj.1"),
                                 ("condition_embedder.image_embedder.ff.net.2", "img_emb.proj.3"),
                                 ("condition_embedder.image_embedder.norm2", "img_emb.proj.4")):  # fmt: skip
                key = key.replace(theirs, name)
            original[key] = value
    ours = TABLE_CLIP.to_original(state)
    assert ours.keys() == original.keys()
    assert all(torch.equal(ours[k], original[k]) for k in original)
    back = convert_wan_transformer_to_diffusers(dict(original))
    assert back.keys() == state.keys() and TABLE_CLIP.from_original(original).keys() == state.keys()
