"""Does writing an output touch an input: the same file, through symlinks, ``..`` and hard
links, an output inside an input folder, an output folder holding an input, and a family of
names in a folder (a training run's output_name)."""

import os

import pytest

from library.saving.input_clash import HARD_LINK, HOLDS, OUTPUT_INSIDE, SAME, clash


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "models" / "sd15" / "unet").mkdir(parents=True)
    (tmp_path / "models" / "sd15" / "unet" / "w.safetensors").write_bytes(b"base")
    (tmp_path / "models" / "vae.safetensors").write_bytes(b"vae")
    (tmp_path / "out").mkdir()
    return tmp_path


def test_the_same_path_however_it_is_written(tree, monkeypatch):
    vae = tree / "models" / "vae.safetensors"
    assert clash(vae, vae).relation == SAME
    assert clash(tree / "out" / ".." / "models" / "vae.safetensors", vae).relation == SAME
    monkeypatch.chdir(tree / "out")
    assert clash("../models/vae.safetensors", vae).relation == SAME
    assert clash(tree / "out" / "merged.safetensors", vae) is None


def test_symlinks_count_both_ways(tree):
    vae = tree / "models" / "vae.safetensors"
    link = tree / "out" / "run.safetensors"
    link.symlink_to(vae)  # writing the output would change what the link points to
    assert clash(link, vae).relation == SAME
    assert clash(vae, link).relation == SAME
    folder_link = tree / "out" / "model"
    folder_link.symlink_to(tree / "models" / "sd15")
    assert clash(tree / "models" / "sd15", folder_link).relation == SAME
    assert clash(folder_link / "merged.safetensors", tree / "models" / "sd15").relation == OUTPUT_INSIDE


def test_a_hard_link_is_the_same_file(tree):
    vae = tree / "models" / "vae.safetensors"
    twin = tree / "out" / "twin.safetensors"
    os.link(vae, twin)
    assert os.stat(twin).st_ino == os.stat(vae).st_ino
    assert clash(twin, vae).relation == HARD_LINK
    copy = tree / "out" / "copy.safetensors"
    copy.write_bytes(vae.read_bytes())  # the same bytes, another file
    assert clash(copy, vae) is None


def test_inside_and_holding(tree):
    model = tree / "models" / "sd15"
    assert clash(model / "merged.safetensors", model).relation == OUTPUT_INSIDE
    assert clash(model / "unet", model).relation == OUTPUT_INSIDE
    found = clash(tree / "models", model / "unet" / "w.safetensors")
    assert found.relation == HOLDS and found.output == tree / "models"
    assert clash(tree / "models2", model) is None  # a name that only starts the same
    assert clash(model, tree / "missing.safetensors") is None  # no input there


def test_a_family_of_names_in_a_folder(tree):
    out = tree / "out"

    def owns(entry):
        return entry.startswith("run")

    (out / "run-state").mkdir()
    (out / "run-state" / "trained.safetensors").write_bytes(b"x")
    (out / "other.safetensors").write_bytes(b"x")
    found = clash(out, out / "run-state", owns)
    assert (found.relation, found.output) == (SAME, out / "run-state")
    found = clash(out, out / "run-state" / "trained.safetensors", owns)
    assert (found.relation, found.output) == (HOLDS, out / "run-state")
    assert clash(out, out / "other.safetensors", owns) is None
    assert clash(out, out, owns).relation == OUTPUT_INSIDE
    assert clash(out / "sub", out, owns).relation == OUTPUT_INSIDE
    os.link(tree / "models" / "vae.safetensors", out / "run.safetensors")
    found = clash(out, tree / "models" / "vae.safetensors", owns)
    assert (found.relation, found.output) == (HARD_LINK, out / "run.safetensors")
