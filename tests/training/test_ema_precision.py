"""The EMA keeps float32 averages of half-precision weights (full_bf16)."""

import torch

from library.training.ema import WeightAverage


def _average_after_a_jump(dtype: torch.dtype) -> torch.Tensor:
    param = torch.nn.Parameter(torch.full((4,), 1.0, dtype=dtype))
    average = WeightAverage([param], decay=0.9999)
    for _ in range(300):
        average.update()
    with torch.no_grad():
        param.fill_(1.5)  # exact in bfloat16 and float32
    for _ in range(3):
        average.update()
    return average.state_dict()["shadow_params"][0]


def test_average_of_bf16_weights_tracks_like_float32_weights():
    from_bf16 = _average_after_a_jump(torch.bfloat16)
    from_fp32 = _average_after_a_jump(torch.float32)
    assert from_bf16.dtype == torch.float32
    torch.testing.assert_close(from_bf16, from_fp32, atol=0, rtol=0)
    # the average sits between bfloat16 steps: a bfloat16 average could not hold it
    assert not torch.equal(from_bf16, from_bf16.to(torch.bfloat16).float())
