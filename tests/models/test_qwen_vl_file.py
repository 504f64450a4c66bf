"""The shared reader of Qwen vision-language text-encoder files (families/qwen_vl_file.py): both
transformers layouts load to the same module, and a file without the language model's embedding
or the vision tower is refused by name from its header, for each kind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from library.errors import ModelError
from library.models.families.file_plans import open_safetensors
from library.models.families.qwen_vl_file import QWEN3_VL, QWEN25_VL, plan_qwen_vl
from library.models.plans import load_plan
from tests.kits.krea2.tiny_files import write_tiny_krea2_files
from tests.kits.qwenimage.tiny_files import write_tiny_qwenimage_files

WRITERS = {"Qwen2.5-VL": (QWEN25_VL, write_tiny_qwenimage_files),
           "Qwen3-VL": (QWEN3_VL, write_tiny_krea2_files)}  # fmt: skip


def _release_layout(key: str) -> str:
    """A current transformers name as the older releases wrote it (independently of the
    reader: language model under model., vision tower at the top)."""
    return key.replace("model.language_model.", "model.", 1).replace("model.visual.", "visual.", 1)


def _plan(path: Path, kind):
    file = open_safetensors(path, "text_encoder", "test")
    return plan_qwen_vl(file, kind, "text_encoder", f"the {kind.name} text encoder")


def _rewritten(source: Path, target: Path, edit) -> Path:
    from safetensors import safe_open

    with safe_open(str(source), "pt") as f:
        meta = f.metadata()
    save_file(edit(load_file(str(source))), str(target), metadata=meta)
    return target


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_either_layout_loads_the_same_weights(tmp_path, name):
    kind, write = WRITERS[name]
    current = write(tmp_path / "files")["text_encoder"]
    older = _rewritten(current, tmp_path / "older.safetensors",
                       lambda t: {_release_layout(k): v for k, v in t.items()})  # fmt: skip
    a = load_plan(_plan(current, kind), torch.float32).state_dict()
    b = load_plan(_plan(older, kind), torch.float32).state_dict()
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", sorted(WRITERS))
@pytest.mark.parametrize(("dropped", "named"), [("embed_tokens", "language model"),
                                                ("visual.", "vision tower")])  # fmt: skip
def test_a_file_without_a_part_is_refused_by_name(tmp_path, name, dropped, named):
    kind, write = WRITERS[name]
    current = write(tmp_path / "files")["text_encoder"]
    cut = _rewritten(current, tmp_path / "cut.safetensors",
                     lambda t: {k: v for k, v in t.items() if dropped not in k})  # fmt: skip
    with pytest.raises(ModelError) as caught:
        _plan(cut, kind)
    message = str(caught.value)
    assert "\n" not in message and str(cut) in message and f"no {named}" in message
    assert kind.example in message
