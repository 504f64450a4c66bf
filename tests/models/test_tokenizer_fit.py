"""Every tokenizer is checked against its text encoder before any weight is read (so the dry
run finds the same): its kind (CLIP or T5) against the encoder's model_type, its size against
the embedding rows, its end / start / padding ids against the encoder's config. For every
family, from model folders and from tokenizer_path, t5_tokenizer_path and tokenizer_cache_dir."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from library.config.flow_schema import FlowSection
from library.config.schema import ModelSection
from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.loader import load_components
from library.models.model_files import shapes_only
from tests.kits.sd.tiny import tiny_vocab_size, write_clip_tokenizer_files, write_tiny_tokenizer

ASSETS = Path(__file__).parents[1] / "assets"


@pytest.fixture(autouse=True)
def no_weights_read(monkeypatch):
    """Every tokenizer problem is found before a weight is read."""

    def refuse(*args, **kwargs):
        raise AssertionError("a weight was read before the tokenizers were checked")

    monkeypatch.setattr(CheckpointFile, "tensor", refuse)


def load(path: Path, **keys):
    """load_components the dry run's way (shapes only); ``keys`` are [model] and [flow] keys."""
    flow = {k: str(v) for k, v in keys.items() if k in FlowSection.model_fields}
    model = {k: str(v) for k, v in keys.items() if k not in flow}
    with shapes_only():
        return load_components(
            ModelSection(pretrained_model_name_or_path=str(path), **model),
            torch.float32,
            FlowSection(**flow),
        )


def error(path: Path, **keys) -> str:
    with pytest.raises(ModelError) as info:
        load(path, **keys)
    message = str(info.value)
    assert "\n" not in message
    return message


def copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def special_tokens(folder: Path, **changes) -> None:
    """Name other special tokens in a tokenizer folder (special_tokens_map.json wins over
    tokenizer_config.json, so both say it)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        edit_json(folder / name, **changes)


def bigger_clip_tokenizer(folder: Path, extra: int = 40) -> Path:
    """The tiny CLIP tokenizer with ``extra`` more tokens than the tiny encoders have rows."""
    from tests.kits.sd.tiny import _byte_alphabet

    alphabet = _byte_alphabet()
    base = alphabet + [c + "</w>" for c in alphabet] + [f"w{i}</w>" for i in range(extra)]
    return write_clip_tokenizer_files(folder, base)


# --- SD 1.x / 2.x / SDXL ----------------------------------------------------------------------


def test_sd_folder_with_a_bigger_vocabulary(tiny_model_dir, tmp_path):
    model = copy(tiny_model_dir, tmp_path)
    shutil.rmtree(model / "tokenizer")
    bigger_clip_tokenizer(model / "tokenizer")
    message = error(model)
    rows = tiny_vocab_size()
    folder = model / "tokenizer"
    assert message.startswith(f"pretrained_model_name_or_path: the tokenizer in {folder}")
    assert f"it has {rows + 40} tokens and the text encoder {rows} embedding rows" in message
    assert "restore it" in message


def test_sd_folder_with_a_t5_tokenizer(tiny_model_dir, tmp_path):
    model = copy(tiny_model_dir, tmp_path)
    shutil.rmtree(model / "tokenizer")
    shutil.copytree(ASSETS / "t5_tokenizer", model / "tokenizer")
    message = error(model)
    assert "it is a T5 tokenizer (its tokenizer_config.json names T5Tokenizer)" in message
    assert "the text encoder takes a CLIP tokenizer" in message


def test_sdxl_second_tokenizer_with_another_end_token(tiny_sdxl_model_dir, tmp_path):
    model = copy(tiny_sdxl_model_dir, tmp_path)
    # The same files with the start token named as the end token: ids 512 / 513 swap meaning.
    special_tokens(model / "tokenizer_2", eos_token="<|startoftext|>")
    message = error(model)
    folder = model / "tokenizer_2"
    assert f"the tokenizer in {folder} does not fit the second text encoder" in message
    assert "its end token '<|startoftext|>' is id 512, the encoder's eos_token_id 513" in message


def test_legacy_clip_ids_pool_at_the_highest_id(tiny_model_dir, tmp_path):
    """OpenAI's and OpenCLIP's published configs say eos_token_id = 2: transformers pools at
    the caption's highest id, so the end token must be the tokenizer's highest id."""
    model = copy(tiny_model_dir, tmp_path)
    config = model / "text_encoder" / "config.json"
    edit_json(config, bos_token_id=0, eos_token_id=2, pad_token_id=1)
    assert load(model).tokenizers[0].eos_token_id == tiny_vocab_size() - 1  # it is: loads
    special_tokens(model / "tokenizer", eos_token="<|startoftext|>")
    message = error(model)
    assert "pools at the highest id, 513" in message and "is id 512" in message


@pytest.fixture(scope="module")
def sd1_file(tmp_path_factory) -> Path:
    from library.models.families.sd.family import SD1
    from library.saving.checkpoint_export import write_single_file
    from tests.kits.sd.tiny import build_tiny_components

    parts = build_tiny_components("sd1")
    path = tmp_path_factory.mktemp("sf") / "sd1.safetensors"
    return write_single_file(
        path, parts["unet"], parts["vae"], [parts["text_encoder"]], SD1, torch.float32
    )


def test_single_file_tokenizer_path_to_a_t5_tokenizer(sd1_file):
    message = error(sd1_file, tokenizer_path=ASSETS / "t5_tokenizer")
    assert message.startswith(f"tokenizer_path: the tokenizer in {ASSETS / 't5_tokenizer'}")
    assert "it is a T5 tokenizer" in message and "point tokenizer_path at" in message


def test_single_file_tokenizer_cache_dir_with_a_bigger_vocabulary(sd1_file, tmp_path):
    cache = tmp_path / "cache"
    bigger_clip_tokenizer(cache / "openai_clip-vit-large-patch14")
    message = error(sd1_file, tokenizer_cache_dir=cache)
    assert message.startswith("tokenizer_cache_dir: the tokenizer in ")
    assert "embedding rows" in message and "set tokenizer_path" in message


def test_tokenizer_path_replaces_a_folders_tokenizer(tiny_model_dir, tmp_path):
    own = write_tiny_tokenizer(tmp_path / "own")
    assert Path(load(tiny_model_dir, tokenizer_path=own).tokenizers[0].name_or_path) == own
    message = error(tiny_model_dir, tokenizer_path=ASSETS / "t5_tokenizer")
    assert message.startswith("tokenizer_path: ") and "it is a T5 tokenizer" in message
    a_file = own / "vocab.json"
    assert f"tokenizer_path {a_file} is a file" in error(tiny_model_dir, tokenizer_path=a_file)
    # the folder's own tokenizer is then not needed
    model = copy(tiny_model_dir, tmp_path)
    shutil.rmtree(model / "tokenizer")
    assert "lacks the tokenizer/ subfolder" in error(model)
    assert Path(load(model, tokenizer_path=own).tokenizers[0].name_or_path) == own


# --- FLUX.1 -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def flux_files(tmp_path_factory) -> dict[str, Path]:
    from tests.kits.flux.tiny_files import write_tiny_flux_files

    return write_tiny_flux_files(tmp_path_factory.mktemp("flux-files"), "dev", 0)


@pytest.fixture(scope="module")
def flux_folder(kit_folders) -> Path:
    """The session's tiny kit folder (flux dev, seed 0): read only."""
    return kit_folders("flux", "dev")


def flux_keys(files, **changes) -> dict:
    keys = {k: files[k] for k in ("clip_l", "t5xxl", "ae")}
    keys.update(tokenizer_path=files["tokenizer"], t5_tokenizer_path=files["t5_tokenizer"])
    return {**keys, **changes}


def test_flux_t5_tokenizer_given_for_clip_l(flux_files):
    """It used to load as a 99-token CLIP tokenizer and train on wrong token ids."""
    t5 = flux_files["t5_tokenizer"]
    message = error(flux_files["transformer"], **flux_keys(flux_files, tokenizer_path=t5))
    assert message.startswith(f"tokenizer_path: the tokenizer in {t5} does not fit CLIP-L")
    assert "it is a T5 tokenizer" in message


def test_flux_t5_tokenizer_with_another_padding_id(flux_files, tmp_path):
    t5 = Path(shutil.copytree(flux_files["t5_tokenizer"], tmp_path / "t5"))
    special_tokens(t5, pad_token="<unk>")
    message = error(flux_files["transformer"], **flux_keys(flux_files, t5_tokenizer_path=t5))
    assert message.startswith(f"t5_tokenizer_path: the tokenizer in {t5} does not fit T5-XXL")
    assert "its pad token '<unk>' is id 2, the encoder's pad_token_id 0" in message


def test_flux_folder_with_a_clip_tokenizer_as_tokenizer_2(flux_folder, tmp_path):
    model = copy(flux_folder, tmp_path)
    shutil.rmtree(model / "tokenizer_2")
    from transformers import CLIPTokenizer

    # with tokenizer.json, which the T5 files check looks for
    CLIPTokenizer.from_pretrained(str(ASSETS / "tokenizer")).save_pretrained(model / "tokenizer_2")
    message = error(model)
    folder = model / "tokenizer_2"
    assert message.startswith(f"pretrained_model_name_or_path: the tokenizer in {folder}")
    assert "it is a CLIP tokenizer" in message and "T5-XXL takes a T5 tokenizer" in message


# --- SD3 ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sd3_files(tmp_path_factory) -> dict[str, Path]:
    from tests.kits.sd3.tiny_files import write_tiny_sd3_files

    return write_tiny_sd3_files(
        tmp_path_factory.mktemp("sd3-files"), "sd3.5-medium", 0, text_encoders_inside=True
    )


@pytest.fixture(scope="module")
def sd3_folder(kit_folders) -> Path:
    """The session's tiny kit folder (sd3 sd3.5-medium, seed 0): read only."""
    return kit_folders("sd3", "sd3.5-medium")


def test_sd3_clip_g_tokenizer_with_a_bigger_vocabulary(sd3_files, tmp_path):
    clips = tmp_path / "clips"
    write_tiny_tokenizer(clips / "tokenizer")
    bigger_clip_tokenizer(clips / "tokenizer_2")
    message = error(
        sd3_files["model"], tokenizer_path=clips, t5_tokenizer_path=sd3_files["t5_tokenizer"]
    )
    assert message.startswith(f"tokenizer_path: the tokenizer in {clips / 'tokenizer_2'}")
    assert "does not fit CLIP-G" in message


def test_sd3_folder_t5_tokenizer_with_another_end_token(sd3_folder, tmp_path):
    model = copy(sd3_folder, tmp_path)
    special_tokens(model / "tokenizer_3", eos_token="<unk>")
    message = error(model)
    assert f"the tokenizer in {model / 'tokenizer_3'} does not fit T5-XXL" in message
    assert "its eos token '<unk>' is id 2, the encoder's eos_token_id 1" in message


def test_sd3_folder_t5_tokenizer_larger_than_the_embedding(sd3_folder, tmp_path):
    model = copy(sd3_folder, tmp_path)
    from tests.kits.flux.tiny import tiny_t5_pieces

    edit_json(model / "text_encoder_3" / "config.json", vocab_size=64)
    message = error(model)
    assert f"it has {len(tiny_t5_pieces())} tokens and T5-XXL 64 embedding rows" in message
