"""Two denoiser experts on two processes (Toy given a second transformer): each optimizer step
routes every process and every micro-batch to the same expert, so DDP reduces that expert's
adapter alone and the run writes the two files one process writes from the same samples."""

from __future__ import annotations

from pathlib import Path

from library.models.families import registry
from tests.distributed.runs import torchrun
from tests.integration.harness import assert_close_dicts, make_images, tensors, train, write_config
from tests.integration.test_expert_training import COMMON, EXPERTS, moved
from tests.kits.toy.entry import TOY_ENTRY
from tests.kits.toy.tiny import write_tiny_toy_experts_folder

TOY_LAUNCH = Path(__file__).with_name("toy_launch.py")


def test_two_processes_train_both_experts_as_one_process_does(tmp_path):
    model = write_tiny_toy_experts_folder(tmp_path / "toy", boundary_ratio=None)
    images = make_images(tmp_path / "imgs", 4, size=64)
    keys = {**COMMON, "max_train_steps": 3}
    one = write_config(
        tmp_path / "one.toml", model, images, tmp_path / "one", train_batch_size=4, **keys
    )
    with registry.registered(TOY_ENTRY):
        assert train(one) == 0
    two = write_config(tmp_path / "two.toml", model, images, tmp_path / "two", train_batch_size=1,
                       gradient_accumulation_steps=2, **keys)  # fmt: skip
    torchrun(two, out=tmp_path / "two", script=TOY_LAUNCH).check()
    for expert in EXPERTS:
        name = f"run_{expert}.safetensors"
        # summation order is all that differs (a step on the other expert moves weights by ~lr)
        alone = tensors(tmp_path / "one" / name)
        assert moved(alone), expert  # both experts had steps
        assert_close_dicts(tensors(tmp_path / "two" / name), alone, 1e-5)
