"""Run under torchrun (2 CPU processes): the text cache filled by sharded text encoders
(fsdp_text_encoder's pieces: text_sharding.sharded_text_encoders, TextEncoderCache.prefill in
lockstep) against the same encoders whole.

Two tiny encoders (a Qwen3 decoder and a CLIP text encoder, both layer kinds) encode five
captions in batches of 2: rank 0's share is 3 captions (2 batches), rank 1's 2 (1 batch, then
one padded call). Once into a memory cache (the shares exchanged), once into a disk cache where
one caption's file already exists (rank 0 then has only 1 batch). Then the sample prompts'
texts (library/sampling/texts.py, as SampleRunner.encode_texts right after the fill), every
rank encoding every prompt with the sharded copies. Each rank writes
``<out>/rank<r>-<cache>.safetensors`` (every caption's cached states, by caption index),
``<out>/rank<r>-samples.safetensors`` (each prompt's [prompt, negative] states, by prompt
index) and ``<out>/rank<r>.json`` (its encode calls, with how many captions each held, and
whether the encoders it called were sharded), and rank 0 ``<out>/whole.safetensors`` (each
caption encoded alone by the whole encoders, in one process, with no cache) and
``<out>/whole-samples.safetensors`` (each prompt's texts so, in one process).

    torchrun --nproc_per_node 2 tests/distributed/text_sharding_fill.py <out>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from library.data.cache_group import CacheGroup  # noqa: E402
from library.models.conditioning_data import TextConditioning  # noqa: E402
from library.sampling.prompts import SamplePrompt  # noqa: E402
from library.sampling.texts import encode_sample_texts, prompt_texts  # noqa: E402
from library.training.text_cache import TextEncoderCache  # noqa: E402
from library.training.text_sharding import sharded_text_encoders  # noqa: E402

CAPTIONS = ["a red square", "a blue circle", "a green dot", "a red square", "two cats", "sky"]
LENGTH, VOCAB = 8, 64
# the sample prompts: the last repeats the first's texts (encoded once)
SAMPLE_TEXTS = [("a red square", "blurry"), ("a cat", ""), ("a red square", "blurry")]


def sample_prompts() -> list[SamplePrompt]:
    return [SamplePrompt(i, text, negative, 64, 64, i, 2, None, None)
            for i, (text, negative) in enumerate(SAMPLE_TEXTS)]  # fmt: skip


def sample_states(encode) -> dict[str, torch.Tensor]:
    """Each sample prompt's [prompt, negative] states (encode_sample_texts), by prompt index."""
    prompts = sample_prompts()
    states = encode_sample_texts(prompts, encode)
    return {str(p.index): states[prompt_texts(p)].hidden.clone() for p in prompts}


def encoders() -> list[torch.nn.Module]:
    from transformers import CLIPTextConfig, CLIPTextModel, Qwen3Config, Qwen3Model

    torch.manual_seed(0)
    qwen = Qwen3Model(Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                  num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=8))  # fmt: skip
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=2, num_attention_heads=2,
                                        bos_token_id=1, eos_token_id=2))  # fmt: skip
    return [m.eval().requires_grad_(False) for m in (qwen, clip)]


def token_ids(captions: list[str]) -> torch.Tensor:
    """A stand-in tokenizer: each character's code, cut or padded to LENGTH."""
    rows = [[ord(c) % VOCAB for c in caption[:LENGTH]] for caption in captions]
    return torch.tensor([row + [0] * (LENGTH - len(row)) for row in rows])


def encode_with(models: list[torch.nn.Module], calls: list | None = None):
    def encode(captions: list[str]) -> TextConditioning:
        if calls is not None:
            sharded = all(type(next(m.parameters())).__name__ == "DTensor" for m in models)
            calls.append({"captions": len(captions), "sharded": sharded})
        ids = token_ids(captions)
        with torch.no_grad():
            states = [m(input_ids=ids).last_hidden_state for m in models]
        return TextConditioning(torch.cat(states, dim=-1), None)

    return encode


def fill(cache: TextEncoderCache, encode, roots, group: CacheGroup) -> None:
    """What build_text_cache does with sharded encoders: shares in lockstep, then (disk) every
    rank reads the others' files, still in lockstep."""
    cache.prefill(CAPTIONS, roots, encode, 2, rank=group.rank, world_size=group.world_size,
                  lockstep=group)  # fmt: skip
    if cache.to_disk:
        group.barrier()
        cache.prefill(CAPTIONS, roots, encode, 2, lockstep=group)


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = CacheGroup()
    whole = encoders()
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        reference = encode_with(whole)
        save_file({str(i): reference([c]).hidden[0] for i, c in enumerate(CAPTIONS)},
                  out / "whole.safetensors")  # fmt: skip
        save_file(sample_states(reference), out / "whole-samples.safetensors")
        # a caption already on disk: rank 0 (whose share it is) reads it instead of encoding
        disk = TextEncoderCache("tiny", to_disk=True)
        disk.prefill(CAPTIONS[:1], [out / "data"], reference, 1)
    group.barrier()
    record: dict = {}
    with sharded_text_encoders(whole, torch.device("cpu"), group.world_size) as sharded:
        for name, to_disk in (("memory", False), ("disk", True)):
            calls: list = []
            cache = TextEncoderCache("tiny", to_disk=to_disk)
            roots = [out / "data"] * len(CAPTIONS) if to_disk else None
            fill(cache, encode_with(sharded, calls), roots, group)
            record[name] = calls
            rows = cache.get(CAPTIONS, roots, encode_with(sharded, calls)).hidden
            save_file({str(i): row.contiguous() for i, row in enumerate(rows)},
                      out / f"rank{rank}-{name}.safetensors")  # fmt: skip
        record["samples"] = calls = []  # as SampleRunner.encode_texts after the fill
        samples = sample_states(encode_with(sharded, calls))
        save_file(samples, out / f"rank{rank}-samples.safetensors")
    (out / f"rank{rank}.json").write_text(json.dumps(record), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
