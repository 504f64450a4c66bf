"""The same samples and seed give the same weights however they are spread over processes.

2 processes x accumulation 2 x batch 1 (torchrun, gloo), 1 x 4 x 1 and 1 x 1 x 4 must write the
same weights after 2 optimizer steps, for every mode of tests/distributed/suite.py: each
registered family's, declared in its kit (ConformanceKit.distributed: today SD's UNet LoRA,
FLUX.1's LoRA on float8 weights, full fine-tune and LoRA with swapped blocks, SD3.5's LoRA with
per-encoder text dropout and random position crops, Z-Image's LoRA on captions of four lengths,
each alone in its micro-batch or padded beside the others, also sharded) and the suite's own
on the tiny SD model (UNet + text-encoder LoRA, full UNet, LyCORIS LoHa with DoRA, sharded
(FSDP2) LyCORIS LoKr with Tucker and max-norm and full UNet with EMA); each family's first mode
must give other weights with another effective batch; and the loss logged per step must be the
mean over every micro-batch of every rank.
"""

from collections import defaultdict
from pathlib import Path

import pytest

from tests.distributed.runs import scalars
from tests.distributed.suite import GUARDED, MODES
from tests.integration.harness import assert_close_dicts, tensors

# Only the float summation order differs (observed: ~2e-8 for LoRA, 1 ulp = 1.2e-7 for UNet
# weights near 1); a wrong reduction or one missed sample moves weights by ~1e-4 or more. A mode
# may declare a wider tolerance (DistributedMode.atol, with its reason in its kit).
ATOL, RTOL = 1e-6, 1e-6
LAUNCHES = [f"eq-{mode}-2x2x1" for mode in MODES]
DENOISERS = ("transformer", "unet")  # diffusers' folder name of the denoiser


def _atol(mode: str) -> float:
    return MODES[mode].atol or ATOL


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("mode", list(MODES))
def test_three_layouts_write_the_same_weights(runs, mode):
    declared = MODES[mode]
    ddp = runs.equivalence(mode, "2x2x1")
    weights = ddp.weights()
    atol = _atol(mode)
    # a sharded run is compared with one process only: the other modes show 1x4x1 = 1x1x4
    layouts = ("1x4x1",) if declared.sharded else ("1x4x1", "1x1x4")
    for layout in layouts:
        assert_close_dicts(weights, runs.equivalence(mode, layout).weights(), atol=atol, rtol=RTOL)
    for rank in (0, 1):  # each process stepped its optimizer exactly twice
        assert len(ddp.rank(rank)["optimizer_lrs"]) == 2
    if "ema_decay" in declared.keys:  # the average, gathered from the shards, too
        ema = ddp.weights("run-ema.safetensors")
        for layout in layouts:
            reference = runs.equivalence(mode, layout).weights("run-ema.safetensors")
            assert_close_dicts(ema, reference, atol=atol, rtol=RTOL)
        assert _max_diff(ema, weights) > 50 * atol  # not the weights themselves
    # the steps moved the weights (else equality would prove nothing)
    if declared.keys.get("train_mode") == "unet":  # the final save writes a diffusers folder
        base = runs.mode_dir(mode)
        sub = next(name for name in DENOISERS if (base / name).is_dir())
        denoiser = Path(sub) / "diffusion_pytorch_model.safetensors"
        trained = tensors(ddp.out / "run" / denoiser)
        assert _max_diff(trained, tensors(base / denoiser)) > 50 * atol
    else:
        # the factors that start at zero (LoRA's up, peft's lora_B, LoHa's w2_a, LoKr's w2_b)
        # moved
        ends = ("lora_up.weight", "lora_B.weight", "hada_w2_a", "lokr_w2_b")
        ups = [v for k, v in weights.items() if k.endswith(ends)]
        assert ups and max(v.abs().max().item() for v in ups) > 100 * ATOL
        for prefix in declared.holds:  # e.g. a text encoder's adapters
            assert any(k.startswith(prefix) for k in weights), prefix
        if declared.only:
            assert all(k.startswith(declared.only) for k in weights)


@pytest.mark.parametrize("mode", GUARDED)
def test_another_effective_batch_gives_other_weights(runs, mode):
    """Guards the test above at both of its tolerances: 2 samples per step instead of 4 must
    change the result."""
    four = runs.equivalence(mode, "2x2x1").weights()
    two = runs.equivalence(mode, "1x2x1").weights()
    assert _max_diff(four, two) > 100 * _atol(mode)


@pytest.mark.parametrize("mode", [mode for mode in MODES if MODES[mode].captions])
def test_a_mode_trains_on_its_own_captions(runs, mode):
    """The images (or videos) of a mode that declares captions carry them, one per sample
    (Z-Image's: four token lengths, checked in its own tests)."""
    folder = runs.mode_images(mode)
    captions = [p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.txt"))]
    assert captions == list(MODES[mode].captions)
    samples = [p for p in folder.iterdir() if p.suffix == (".mp4" if MODES[mode].clips else ".png")]
    assert len(samples) == len(captions)


def test_logged_loss_is_the_mean_over_ranks_and_micro_batches(runs):
    ddp = runs.equivalence("unet-lora", "2x2x1")
    big = runs.equivalence("unet-lora", "1x1x4")
    logged = scalars(ddp.out / "logs", "loss/step")
    assert [step for step, _ in logged] == [1, 2]

    # independent: average the 2 x 2 micro-batch losses each rank computed in each step
    per_step, positions = defaultdict(list), defaultdict(list)
    for rank in (0, 1):
        for micro in ddp.rank(rank)["micro_losses"]:
            per_step[micro["micro"] // 2].append(micro["loss"])
            positions[micro["micro"] // 2].append(micro["positions"])
    for (_, value), step in zip(logged, (0, 1), strict=True):
        assert len(per_step[step]) == 4
        assert value == pytest.approx(sum(per_step[step]) / 4, rel=1e-6)

    # the 1 x 1 x 4 run's loss is its batch mean over the same samples
    big_micro = big.rank(0)["micro_losses"]
    for step in (0, 1):
        flat = sorted(p for batch in positions[step] for p in batch)
        assert flat == sorted(big_micro[step]["positions"])  # ranks hold disjoint shards of it
    big_logged = scalars(big.out / "logs", "loss/step")
    assert [v for _, v in big_logged] == pytest.approx([v for _, v in logged], rel=1e-5)
    assert [v for _, v in big_logged] == pytest.approx([m["loss"] for m in big_micro], rel=1e-6)


def test_only_rank_zero_writes_logs(runs):
    ddp = runs.equivalence("unet-lora", "2x2x1")
    files = list((ddp.out / "logs").rglob("events.out.tfevents.*"))
    # event file names end in .<pid>.<n>: every file must come from one process
    assert files and len({f.name.split(".")[-2] for f in files}) == 1
    assert [len(ddp.rank(r)["reported"]) for r in (0, 1)] == [2, 2]  # both reached each step
    # and one loading bar per model: transformers' bar for the text encoder, from rank 0 only
    assert ddp.log.count("Loading weights: 100%") == 1, ddp.log


@pytest.mark.parametrize("mode", [mode for mode in MODES if MODES[mode].references])
def test_a_mode_with_references_trains_each_image_with_its_own(runs, mode):
    """An edit model's mode pairs each image with its reference of two sizes, and every layout
    plans the two groups they make (the 2-process run's plan): 4 images of one bucket make two steps of 2 samples and 2
    padding slots each, where without references they would make one step (the equivalence
    above then holds with them)."""
    folder = runs.mode_images(mode)
    controls = sorted(p.name for p in runs.controls(folder).glob("*.png"))
    assert controls == sorted(p.name for p in folder.glob("*.png"))
    log = runs.equivalence(mode, "2x2x1").check().log  # the launched run's console
    assert "4 reference images from" in log
    assert "4 padding slots" in log and "optimizer steps per epoch: 2," in log
