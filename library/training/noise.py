"""Per-sample randomness keyed by (seed, epoch, position), independent of batching and processes.

Every random draw of a training sample (the VAE posterior sample, the noise, the timestep, the
offset noise, the strengths, the input-perturbation and pyramid noise) comes from generators
seeded by the sample's key alone. So a sample gets the same draws whether it is trained in a
batch of 4, as one of 4 accumulated micro-batches, or on another process: the run's result
depends on which samples form each optimizer step, never on how they are spread over
micro-batches and ranks.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from library.errors import ConfigError

# Optional draws whose size depends on the options live in their own streams, so turning them on
# or off never moves the draws of the main stream.
IP_NOISE_STREAM = "ip_noise"
MULTIRES_STREAM = "multires"
# A flow-matching objective's noise-level draws (one standard normal, one uniform per sample).
FLOW_TIME_STREAM = "flow_time"
# A family's random conditioning choices (ModelFamily.conditioning_draws uniforms per sample:
# SD3's per-encoder text dropout and position crops).
CONDITIONING_STREAM = "conditioning"


def sample_seed(seed: int, epoch: int, position: int, stream: str = "") -> int:
    """A 63-bit seed mixed from the key (and a stream name); stable across processes and runs."""
    key = f"{seed}:{epoch}:{position}" + (f":{stream}" if stream else "")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class NoiseOptions:
    """How the training noise and timesteps are made; the noise keys of TrainingSection."""

    noise_offset: float = 0.0
    noise_offset_random_strength: bool = False
    adaptive_noise_scale: float = 0.0
    multires_noise_iterations: int = 0
    multires_noise_discount: float = 0.3
    ip_noise_gamma: float = 0.0
    ip_noise_gamma_random_strength: bool = False
    min_timestep: int = 0
    max_timestep: int | None = None
    preserve_distribution_shape: bool = False

    @classmethod
    def from_training(cls, training: object) -> NoiseOptions:
        """The options of a TrainingSection (any object with these attribute names)."""
        return cls(**{name: getattr(training, name) for name in cls.__dataclass_fields__})

    def timestep_range(self, num_timesteps: int) -> tuple[int, int]:
        """(low, high): timesteps are drawn from [low, high), or are ``low`` when both are equal."""
        low = self.min_timestep
        high = num_timesteps if self.max_timestep is None else self.max_timestep
        if not 0 <= low <= high <= num_timesteps or low >= num_timesteps:
            raise ConfigError(
                f"min_timestep = {low} / max_timestep = {high} do not fit the model's "
                f"{num_timesteps} timesteps; need min_timestep <= max_timestep <= {num_timesteps} "
                f"and min_timestep < {num_timesteps}"
            )
        return low, high


@dataclass
class SampleDraws:
    """The random inputs of one micro-batch, stacked along the batch dimension."""

    latent_eps: torch.Tensor  # standard normal, shape of the latents: samples the VAE posterior
    noise: torch.Tensor  # standard normal, shape of the latents: the diffusion noise
    timesteps: torch.Tensor  # long [B]
    offset: torch.Tensor  # standard normal [B, C, 1, ...] (1 for every other axis): noise_offset
    offset_strength: torch.Tensor  # uniform [0, 1) [B]: noise_offset_random_strength
    ip_strength: torch.Tensor  # uniform [0, 1) [B]: ip_noise_gamma_random_strength
    ip_noise: torch.Tensor | None  # standard normal, shape of the latents, when ip_noise_gamma
    pyramid: torch.Tensor | None  # the multires octaves summed, when multires_noise_iterations
    # standard normal and uniform [0, 1) [B]: a flow-matching objective's noise levels
    time_normal: torch.Tensor | None = None
    time_uniform: torch.Tensor | None = None


def draw(
    seed: int,
    epoch: int,
    positions: list[int],
    latent_shape: tuple[int, ...],
    num_timesteps: int,
    device: torch.device,
    options: NoiseOptions | None = None,
    flow_times: bool = False,
) -> SampleDraws:
    """Draw each sample's randoms on the CPU from its own generators, then move them to ``device``.

    The draw order inside the main generator is fixed, so a new kind of draw must be appended at
    the end (or get its own stream) to keep existing runs reproducible. ``flow_times`` adds the
    flow-matching noise-level draws (their own stream).
    """
    options = options or NoiseOptions()
    low, high = options.timestep_range(num_timesteps)
    fields: dict[str, list[torch.Tensor]] = {name: [] for name in SampleDraws.__dataclass_fields__}
    for position in positions:
        one = _draw_one((seed, epoch, position), latent_shape, low, high, options, flow_times)
        for name, value in one.items():
            fields[name].append(value)
    return SampleDraws(**{name: _join(name, items, device) for name, items in fields.items()})


def _draw_one(
    key: tuple[int, int, int],
    shape: tuple[int, ...],
    low: int,
    high: int,
    options: NoiseOptions,
    flow_times: bool = False,
) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(sample_seed(*key))
    out = {
        "latent_eps": torch.randn(shape, generator=gen),
        "noise": torch.randn(shape, generator=gen),
        # randint consumes the stream alike whatever the range, so later draws never move.
        "timesteps": torch.randint(low, max(high, low + 1), (1,), generator=gen),
        "offset": torch.randn((shape[0], *([1] * (len(shape) - 1))), generator=gen),
        "offset_strength": torch.rand((1,), generator=gen),
        "ip_strength": torch.rand((1,), generator=gen),
    }
    if options.ip_noise_gamma:
        ip_gen = torch.Generator().manual_seed(sample_seed(*key, IP_NOISE_STREAM))
        out["ip_noise"] = torch.randn(shape, generator=ip_gen)
    if flow_times:
        time_gen = torch.Generator().manual_seed(sample_seed(*key, FLOW_TIME_STREAM))
        out["time_normal"] = torch.randn((1,), generator=time_gen)
        out["time_uniform"] = torch.rand((1,), generator=time_gen)
    if options.multires_noise_iterations:
        pyramid_gen = torch.Generator().manual_seed(sample_seed(*key, MULTIRES_STREAM))
        # Every axis before the two spatial ones counts as a channel (a video VAE's frame axis
        # too): the octaves are images, and [C, h, w] latents draw exactly as they always did.
        flat = (math.prod(shape[:-2]), *shape[-2:])
        out["pyramid"] = pyramid_noise(
            pyramid_gen, flat, options.multires_noise_iterations, options.multires_noise_discount
        ).view(shape)
    return out


_PER_SAMPLE_SCALARS = (
    "timesteps",
    "offset_strength",
    "ip_strength",
    "time_normal",
    "time_uniform",
)


def keyed_uniforms(
    seed: int, epoch: int, positions: list[int], count: int, stream: str, device
) -> torch.Tensor:
    """[B, count] uniform [0, 1) draws, row i from sample (seed, epoch, positions[i])'s own
    ``stream``: the same values however the samples are batched."""
    rows = [
        torch.rand(
            count, generator=torch.Generator().manual_seed(sample_seed(seed, epoch, p, stream))
        )
        for p in positions
    ]
    return torch.stack(rows).to(device)


def _join(name: str, items: list[torch.Tensor], device: torch.device) -> torch.Tensor | None:
    if not items:
        return None
    joined = torch.cat(items) if name in _PER_SAMPLE_SCALARS else torch.stack(items)
    return joined.to(device)


def pyramid_noise(
    gen: torch.Generator, shape: tuple[int, int, int], iterations: int, discount: float
) -> torch.Tensor:
    """Sum of ``iterations`` octaves of noise, each drawn at a random coarser size and upsampled.

    Octave i is drawn at size / r**i with r uniform in [2, 4) and weighted discount**i; octave 0
    is full size. It stops after the first octave that is 1 pixel high or wide.
    """
    channels, height, width = shape
    total = torch.zeros(shape)
    for i in range(iterations):
        r = 2.0 + 2.0 * float(torch.rand((), generator=gen, dtype=torch.float64))
        h, w = max(1, int(height / r**i)), max(1, int(width / r**i))
        octave = torch.randn((1, channels, h, w), generator=gen)
        upsampled = F.interpolate(
            octave, size=(height, width), mode="bilinear", align_corners=False
        )
        total += upsampled[0] * discount**i
        if h == 1 or w == 1:
            break
    return total


def training_noise(
    draws: SampleDraws, latents: torch.Tensor, options: NoiseOptions
) -> tuple[torch.Tensor, torch.Tensor]:
    """(target noise, input noise): the noise the model must predict and the noise added to x0.

    Offset noise (random strength, adaptive scale), then multires octaves (each sample rescaled
    to unit standard deviation on its own), then input perturbation on the input side only.
    """
    noise = draws.noise
    dims = latents.dim()
    per_sample = (-1, *([1] * (dims - 1)))  # a [B] value broadcast over each sample's latents
    if options.noise_offset:
        strength = torch.full_like(draws.offset_strength, options.noise_offset)
        if options.noise_offset_random_strength:
            strength = strength * draws.offset_strength
        strength = strength.view(per_sample)
        if options.adaptive_noise_scale:
            channel_mean = latents.float().mean(dim=tuple(range(2, dims)), keepdim=True).abs()
            strength = (strength + options.adaptive_noise_scale * channel_mean).clamp(min=0.0)
        noise = noise + strength * draws.offset
    if options.multires_noise_iterations:
        noise = noise + draws.pyramid
        noise = noise / noise.std(dim=tuple(range(1, dims)), keepdim=True)
    input_noise = noise
    if options.ip_noise_gamma:
        gamma = torch.full_like(draws.ip_strength, options.ip_noise_gamma)
        if options.ip_noise_gamma_random_strength:
            gamma = gamma * draws.ip_strength
        input_noise = noise + gamma.view(per_sample) * draws.ip_noise
    return noise, input_noise
