"""The same samples and seed give the same weights however they are spread over processes.

2 processes x accumulation 2 x batch 1 (torchrun, gloo), 1 x 4 x 1 and 1 x 1 x 4 must write the
same weights after 2 optimizer steps, for UNet LoRA, UNet + text-encoder LoRA, full UNet,
LyCORIS LoHa (with DoRA, text encoder too), sharded (FSDP2) LyCORIS LoKr (Tucker, max-norm)
and full UNet (with EMA), Flux.1
LoRA (transformer, CLIP-L, T5), Flux.1 full fine-tune, SD3.5 LoRA (MMDiT, CLIP-L, CLIP-G,
with per-encoder text dropout and random position crops) and Z-Image LoRA (captions of four
lengths, each alone in its micro-batch or padded beside the others; also sharded); and
the loss logged per step must be the mean over every micro-batch of every rank.
"""

from collections import defaultdict
from pathlib import Path

import pytest

from tests.distributed.runs import scalars
from tests.distributed.suite import MODE_MODELS, MODES, ZIMAGE_CAPTIONS
from tests.integration.harness import assert_close_dicts, tensors

# Only the float summation order differs (observed: ~2e-8 for LoRA, 1 ulp = 1.2e-7 for UNet
# weights near 1); a wrong reduction or one missed sample moves weights by ~1e-4 or more.
ATOL, RTOL = 1e-6, 1e-6
# FLUX.1's T5 adapters sit after relative-position attention and RMS norms, whose float32 sums
# differ by up to ~2e-6 between layouts after 2 steps (observed); a wrong reduction or a missed
# sample still moves them by far more (test_another_effective_batch_gives_other_weights).
MODE_ATOL = {"flux-lora": 5e-6, "flux-swap": 5e-6}
LAUNCHES = [f"eq-{mode}-2x2x1" for mode in MODES]


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("mode", list(MODES))
def test_three_layouts_write_the_same_weights(runs, mode, tiny_model_dir):
    ddp = runs.equivalence(mode, "2x2x1")
    weights = ddp.weights()
    atol = MODE_ATOL.get(mode, ATOL)
    # a sharded run is compared with one process only: the other modes show 1x4x1 = 1x1x4
    layouts = ("1x4x1",) if "fsdp" in MODES[mode][0] else ("1x4x1", "1x1x4")
    for layout in layouts:
        assert_close_dicts(weights, runs.equivalence(mode, layout).weights(), atol=atol, rtol=RTOL)
    for rank in (0, 1):  # each process stepped its optimizer exactly twice
        assert len(ddp.rank(rank)["optimizer_lrs"]) == 2
    if "ema_decay" in MODES[mode][0]:  # the average, gathered from the shards, too
        ema = ddp.weights("run-ema.safetensors")
        for layout in layouts:
            reference = runs.equivalence(mode, layout).weights("run-ema.safetensors")
            assert_close_dicts(ema, reference, atol=atol, rtol=RTOL)
        assert _max_diff(ema, weights) > 50 * atol  # not the weights themselves
    # the steps moved the weights (else equality would prove nothing)
    if MODES[mode][0].get("train_mode") == "unet":  # the final save writes a diffusers folder
        sub, base = (
            ("transformer", runs.flux_dir()) if mode in MODE_MODELS else ("unet", tiny_model_dir)
        )
        denoiser = Path(sub) / "diffusion_pytorch_model.safetensors"
        trained = tensors(ddp.out / "run" / denoiser)
        assert _max_diff(trained, tensors(base / denoiser)) > 50 * atol
    else:
        # the factors that start at zero (LoRA's up, LoHa's w2_a, LoKr's w2_b) moved
        ups = [v for k, v in weights.items() if k.endswith(("lora_up.weight", "hada_w2_a",
                                                             "lokr_w2_b"))]  # fmt: skip
        assert ups and max(v.abs().max().item() for v in ups) > 100 * ATOL
        if mode == "unet+te-lora":
            assert any(k.startswith("lora_te_") for k in weights)
        if mode == "flux-lora":
            assert any(k.startswith("lora_te3_") for k in weights)
        if mode == "sd3-lora":
            assert any(k.startswith("lora_te2_") for k in weights)
        if mode.startswith("zimage"):  # the transformer's joint blocks, in Z-Image's own names
            assert all(k.startswith("diffusion_model.layers.") for k in weights)


@pytest.mark.parametrize("mode", ["unet-lora", "flux-lora", "zimage-lora"])
def test_another_effective_batch_gives_other_weights(runs, mode):
    """Guards the test above at both of its tolerances: 2 samples per step instead of 4 must
    change the result."""
    four = runs.equivalence(mode, "2x2x1").weights()
    two = runs.equivalence(mode, "1x2x1").weights()
    assert _max_diff(four, two) > 100 * MODE_ATOL.get(mode, ATOL)


@pytest.mark.parametrize("mode", ["zimage-lora"])
def test_zimage_captions_differ_in_length(runs, mode):
    """What makes zimage-lora a proof of batching by TextConditioning.lengths: the captions it
    trains on are four lengths, which the transformer pads to four lengths again."""
    from transformers import AutoTokenizer

    from library.models.families.zimage.conditioning import tokenize_captions

    folder = runs.zimage_images()
    captions = [p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.txt"))]
    assert captions == list(ZIMAGE_CAPTIONS)
    tokenizer = AutoTokenizer.from_pretrained(str(runs.zimage_dir() / "tokenizer"))
    lengths = tokenize_captions(tokenizer, captions)[1].sum(dim=1).tolist()
    assert len(set(lengths)) == 4 and len({-(-n // 32) for n in lengths}) == 4, lengths


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
