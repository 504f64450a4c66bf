"""umT5 as Wan-AI ship it (models_t5_umt5-xxl-enc-bf16.pth: a torch file of the encoder in the
names of Wan's own T5 code) loads as transformers' UMT5EncoderModel computing what Wan's encoder
computes: checked against a forward written here from Wan's layout (token embedding; per block
an RMS-normed self-attention with its own bucketed position bias and an RMS-normed feed-forward
fc2(fc1(x) * gelu_tanh(gate(x))); a final RMS norm), not against the renaming under test."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save_file

from library.errors import ModelError
from library.models.checkpoint_file import CheckpointFile
from library.models.families.wan.t5_file import plan_t5_file, umt5_name
from library.models.plans import load_plan
from tests.kits.scaled_fp8 import scaled

WIDTH, HEADS, FFN, LAYERS, BUCKETS, VOCAB = 32, 4, 48, 2, 8, 64
MAX_DISTANCE = 128  # Wan's code's (and umT5-XXL's)


def wan_layout(seed: int = 0) -> dict[str, torch.Tensor]:
    """A tiny encoder in Wan's names (its T5Encoder's state dict), random."""
    g = torch.Generator().manual_seed(seed)

    def draw(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    state = {"token_embedding.weight": draw(VOCAB, WIDTH, scale=1.0),
             "norm.weight": 1 + draw(WIDTH)}  # fmt: skip
    for i in range(LAYERS):
        b = f"blocks.{i}."
        state |= {b + f"attn.{p}.weight": draw(WIDTH, WIDTH) for p in "qkvo"}
        state |= {b + "norm1.weight": 1 + draw(WIDTH), b + "norm2.weight": 1 + draw(WIDTH),
                  b + "ffn.gate.0.weight": draw(FFN, WIDTH), b + "ffn.fc1.weight": draw(FFN, WIDTH),
                  b + "ffn.fc2.weight": draw(WIDTH, FFN),
                  b + "pos_embedding.embedding.weight": draw(BUCKETS, HEADS, scale=1.0)}  # fmt: skip
    return state


def _rms(x, weight):
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _buckets(length: int) -> torch.Tensor:
    """T5's bidirectional relative-position buckets [L, L] (key position - query position)."""
    rel = torch.arange(length)[None, :] - torch.arange(length)[:, None]
    half = BUCKETS // 2
    base = (rel > 0).long() * half
    rel = rel.abs()
    exact = half // 2
    far = exact + (torch.log(rel.clamp(min=1).float() / exact) / math.log(MAX_DISTANCE / exact)
                   * (half - exact)).long()  # fmt: skip
    return base + torch.where(rel < exact, rel, far.clamp(max=half - 1))


def wan_forward(state, ids, mask) -> torch.Tensor:
    """Wan's T5 encoder on ``ids`` [B, L] with the padding ``mask``, from its tensors."""
    x = state["token_embedding.weight"][ids]
    b, length, _ = x.shape
    blocked = (mask == 0)[:, None, None, :]
    for i in range(LAYERS):
        w = {k[len(f"blocks.{i}.") :]: v for k, v in state.items() if k.startswith(f"blocks.{i}.")}
        h = _rms(x, w["norm1.weight"])
        q, k, v = (
            (h @ w[f"attn.{p}.weight"].T).view(b, length, HEADS, -1).transpose(1, 2) for p in "qkv"
        )
        bias = w["pos_embedding.embedding.weight"][_buckets(length)].permute(2, 0, 1)
        scores = (q @ k.transpose(-1, -2) + bias).masked_fill(blocked, torch.finfo(x.dtype).min)
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, length, -1)
        x = x + attended @ w["attn.o.weight"].T
        h = _rms(x, w["norm2.weight"])
        gate = torch.nn.functional.gelu(h @ w["ffn.gate.0.weight"].T, approximate="tanh")
        x = x + ((h @ w["ffn.fc1.weight"].T) * gate) @ w["ffn.fc2.weight"].T
    return _rms(x, state["norm.weight"])


def test_wans_pth_encodes_as_wans_own_encoder(tmp_path):
    state = wan_layout()
    path = tmp_path / "models_t5_umt5-xxl-enc-bf16.pth"
    torch.save(state, path)
    encoder = load_plan(plan_t5_file(CheckpointFile(path)), torch.float32)
    assert type(encoder).__name__ == "UMT5EncoderModel"
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    ours = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    theirs = wan_forward(state, ids, mask)
    kept = mask.bool()
    torch.testing.assert_close(ours[kept], theirs[kept], rtol=1e-4, atol=1e-4)


def test_a_wan_pth_with_a_tensor_of_another_model_is_named(tmp_path):
    state = wan_layout() | {"blocks.0.attn.rel.weight": torch.zeros(2)}
    path = tmp_path / "odd.pth"
    torch.save(state, path)
    with pytest.raises(ModelError, match=r"t5 = .*odd\.pth is not the umT5-XXL.*blocks\.0\.attn"
                                         r"\.rel\.weight"):  # fmt: skip
        plan_t5_file(CheckpointFile(path))


def test_comfys_scaled_fp8_umt5_encodes_as_wans_encoder_of_its_dequantized_weights(tmp_path):
    """Comfy-Org's umt5_xxl_fp8_e4m3fn_scaled.safetensors: transformers' names, the scaled_fp8
    marker and a scale_weight beside each fp8 matrix. It encodes as Wan's encoder (written
    here) of each matrix's fp8 values times its scale."""
    wan = wan_layout()
    names = {umt5_name(k): k for k in wan}
    stored, want = scaled({name: wan[k] for name, k in names.items()}, "scaled_fp8")
    path = tmp_path / "umt5_xxl_fp8_e4m3fn_scaled.safetensors"
    save_file(stored, str(path))
    encoder = load_plan(plan_t5_file(CheckpointFile(path)), torch.float32)
    ids = torch.randint(2, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ours = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    theirs = wan_forward({k: want[name].float() for name, k in names.items()}, ids, mask)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    unscaled = wan_forward({k: stored[name].float() for name, k in names.items()}, ids, mask)
    assert not torch.allclose(ours, unscaled, rtol=1e-4, atol=1e-4)  # the scales were applied
