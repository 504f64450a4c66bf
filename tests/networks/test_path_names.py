"""The adapter-file names of Linears named by path (library/networks/path_names.py): the names of
a model whose name table renames its Linears one to one, under further heads, and the original
names written instead of the diffusers paths when a family asks for them."""

from __future__ import annotations

from torch import nn

from library.models.families.name_table import NameTable
from library.networks.path_names import path_modules, path_names

TABLE = NameTable(top={"first": "img_in", "last.linear": "proj.linear"}, lists=(), model="Toy")


def _model() -> nn.Module:
    model = nn.Module()
    model.img_in = nn.Linear(2, 3)
    model.proj = nn.Module()
    model.proj.linear = nn.Linear(3, 2)
    return model


def test_every_name_of_a_renamed_linear_and_the_further_heads():
    names = path_modules(_model(), TABLE, heads=("base_model.model.",))
    for path, original in (("img_in", "first"), ("proj.linear", "last.linear")):
        flat, flat_original = path.replace(".", "_"), original.replace(".", "_")
        for name in (f"diffusion_model.{path}", f"transformer.{path}", f"lora_unet_{flat}",
                     f"lycoris_{flat}", f"diffusion_model.{original}",
                     f"lora_unet_{flat_original}", f"base_model.model.{original}"):  # fmt: skip
            assert names.pop(name) == (path,), name
    assert names == {}


def test_written_as_the_diffusers_path_or_the_original():
    assert (
        path_names("Toy", "img_in", TABLE).written("proj.linear") == "diffusion_model.proj.linear"
    )
    original = path_names("Toy", "img_in", TABLE, writes_original=True)
    assert original.written("proj.linear") == "diffusion_model.last.linear"
    assert original.examples.startswith("diffusion_model.first or ")
