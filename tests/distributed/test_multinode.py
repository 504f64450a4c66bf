"""Two "nodes" on localhost (two torchrun launches, one process each) train like one node."""

from tests.integration.harness import assert_close_dicts

LAUNCHES = ["two-nodes", "eq-unet-lora-2x2x1"]


def test_two_nodes_match_one_node_with_two_processes(runs):
    node0, node1 = runs.two_nodes()
    assert node0.returncode == 0, node0.log[-4000:]
    assert node1.returncode == 0, node1.log[-4000:]
    one_node = runs.equivalence("unet-lora", "2x2x1")
    # same ranks, same reduction over 2 processes: nothing but the transport differs
    assert_close_dicts(node0.weights(), one_node.weights(), atol=1e-7)

    # both launches joined one process group: each global rank ran DDP and saw its own shard
    shards = []
    for rank in (0, 1):
        record = node0.rank(rank)  # the nodes share the probe folder, one file per global rank
        assert record["world_size"] == 2, f"rank {rank} trained alone"
        assert [d["module"] for d in record["ddp"]] == ["unet"]
        assert len(record["optimizer_lrs"]) == 2
        shards.append({p for m in record["micro_losses"] for p in m["positions"]})
    assert shards[0].isdisjoint(shards[1])
    # only global rank 0 writes, so only it may say "saved <path>": on a real second machine
    # that path does not exist (accelerate's print is per node, is_local_main_process)
    assert "\nsaved " in node0.log and "\nsaved " not in node1.log
