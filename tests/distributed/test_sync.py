"""Gradients are synchronised once per optimizer step, by DDP's reducer, and nowhere else.

The "sync" run trains UNet + text-encoder LoRA on 2 processes with accumulation 4 for 4
optimizer steps, recording every rank's gradients after each backward and, in a DDP
communication hook, what each bucket carried into its all-reduce. The "acc1" run is the same
with accumulation 1.
"""

from collections import Counter

import torch

ACCUMULATION, STEPS = 4, 4
LAUNCHES = ["sync", "acc1"]


def _last_of_window(micro: int, accumulation: int) -> bool:
    return micro % accumulation == accumulation - 1


def test_rank_gradients_differ_inside_a_window_and_agree_at_its_end(runs):
    run = runs.schedule("sync")
    rank0, rank1 = run.grads(0), run.grads(1)
    trained = sum(d["trained_tensors"] for d in run.rank(0)["ddp"])
    assert len(rank0["grads"]) == len(rank1["grads"]) == ACCUMULATION * STEPS
    for micro, (a, b) in enumerate(zip(rank0["grads"], rank1["grads"], strict=True)):
        assert a.keys() == b.keys() and len(a) == trained
        worst = max((a[k] - b[k]).abs().max().item() for k in a)
        if _last_of_window(micro, ACCUMULATION):
            assert worst == 0.0, f"micro-batch {micro + 1}: ranks disagree after the sync"
        else:  # each rank holds only its own shard's gradients: no sync happened
            assert worst > 1e-6, f"micro-batch {micro + 1}: ranks agree inside the window"


def test_synced_gradient_is_the_mean_of_the_ranks_local_sums(runs):
    run = runs.schedule("sync")
    rank0, rank1 = run.grads(0), run.grads(1)
    locals0, locals1 = rank0["bucket_inputs"], rank1["bucket_inputs"]
    assert [m for m, _ in locals0] == [m for m, _ in locals1]
    for (micro, local0), (_, local1) in zip(locals0, locals1, strict=True):
        assert _last_of_window(micro, ACCUMULATION)
        synced = rank0["grads"][micro]
        for name, g0 in local0.items():
            expected = (g0 + local1[name]) / 2  # plain average of what each rank accumulated
            assert torch.allclose(synced[name], expected, atol=1e-9, rtol=1e-6), name
            assert not torch.equal(g0, local1[name]) or not g0.any(), name


def _per_step(record: dict, accumulation: int) -> Counter:
    return Counter(hook["micro"] // accumulation for hook in record["hooks"])


def test_collectives_per_step_equal_ddp_buckets_for_any_accumulation(runs):
    counts = {}
    for name, accumulation in (("sync", ACCUMULATION), ("acc1", 1)):
        run = runs.schedule(name)
        for rank in (0, 1):
            record = run.rank(rank)
            # DDP's own bucket count for each prepared module (its logging data)
            buckets = sum(len(d["bucket_sizes"].split(",")) for d in record["ddp"])
            assert {d["module"] for d in record["ddp"]} == {"unet", "text_encoder"}
            assert len(record["optimizer_lrs"]) == STEPS
            assert all(_last_of_window(h["micro"], accumulation) for h in record["hooks"])
            assert _per_step(record, accumulation) == {step: buckets for step in range(STEPS)}
            assert len(record["hooks"]) == STEPS * buckets
            counts[name, rank] = [(h["module"], h["bucket"], h["bytes"]) for h in record["hooks"]]
    assert counts["sync", 0] == counts["acc1", 0] == counts["sync", 1] == counts["acc1", 1]


def test_no_collective_inside_an_accumulation_window(runs):
    """Between window ends nothing talks: no gradient bucket, no loss reduction, no broadcast."""
    run = runs.schedule("sync")
    for rank in (0, 1):
        record = run.rank(rank)
        events = [("gradient bucket", hook["micro"]) for hook in record["hooks"]]
        events += [(c["op"], c["micro"]) for c in record["collectives"]]
        events = [(op, micro) for op, micro in events if micro >= 0]  # -1: set-up, before training
        inside = [(op, m + 1) for op, m in events if not _last_of_window(m, ACCUMULATION)]
        assert not inside, f"rank {rank}: collectives during micro-batches {inside}"
        # at each window's end: the buckets and the step's loss agreement
        ends = {m for op, m in events if op != "gradient bucket"}
        assert ends == {s * ACCUMULATION + ACCUMULATION - 1 for s in range(STEPS)}
