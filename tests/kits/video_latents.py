"""A stand-in family over a video VAE (latents [B, C, F', h, w] normalised per channel) for the
shared training code's tests, and the DDPM loss over such latents written out by hand.

``VIDEO``'s denoiser is any module taking 5-D latents (a Conv3d); ``TWIN`` reads the same VAE
through a codec that drops the one latent frame of an image, so with one frame both must give
the very same numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from diffusers import DDPMScheduler

from library.data.cache_group import CacheGroup
from library.models.conditioning import Conditioning, TextConditioning
from library.models.families.base import ModelFamily
from library.models.latent_codec import LatentLayout
from library.models.video_latent_codec import ChannelNormalizedVideoCodec
from library.training.caching import build_latent_cache
from library.training.noise import NoiseOptions, draw
from library.training.objectives import DDPMObjective
from library.training.step import StepInputs


@dataclass(frozen=True)
class FrameDropped:
    """A video codec read as an image codec: its one latent frame squeezed away."""

    video: ChannelNormalizedVideoCodec

    @property
    def layout(self) -> LatentLayout:
        return LatentLayout(self.video.layout.channels, self.video.layout.factor)

    def posterior(self, pixels):
        return tuple(t.squeeze(2) for t in self.video.posterior(pixels))

    def to_latents(self, sample):
        return self.video.to_latents(sample.unsqueeze(2)).squeeze(2)

    def to_decoder(self, latents):
        return self.video.to_decoder(latents.unsqueeze(2)).squeeze(2)


@dataclass(frozen=True, kw_only=True)
class VideoLatentFamily(ModelFamily):
    """A family whose denoiser takes video latents (one frame for an image, 1 + (F - 1) / 4 for
    a clip of F); with ``drop_frames`` its codec and denoiser call are the 4-D twin."""

    TRAINS_CLIPS = True
    drop_frames: bool = False

    def latent_codec(self, vae):
        codec = ChannelNormalizedVideoCodec(vae)
        return FrameDropped(codec) if self.drop_frames else codec

    def predict(self, denoiser, noisy, timesteps, cond):
        out = denoiser(noisy if noisy.dim() == 5 else noisy.unsqueeze(2))
        return out if noisy.dim() == 5 else out.squeeze(2)

    def encode_text(self, tokenizers, text_encoders, captions, device, *args):
        return TextConditioning(hidden=torch.zeros(len(captions), 1, 1, device=device))

    def assemble_conditioning(self, text, batch, device, dtype=None):
        return Conditioning(encoder_hidden_states=text.hidden)


VIDEO = VideoLatentFamily(
    name="video-latents",
    prediction_type="epsilon",
    base_model_version="test",
    modelspec_architecture="test",
    default_resolution=32,
)
TWIN = dataclasses.replace(VIDEO, drop_frames=True)


@dataclass(frozen=True, kw_only=True)
class FirstFrameFamily(VideoLatentFamily):
    """VIDEO whose denoiser also takes the sample's first frame (image-to-video models)."""

    FIRST_FRAME_CONDITION = True


FIRST_FRAME = FirstFrameFamily(**{f.name: getattr(VIDEO, f.name) for f in dataclasses.fields(VIDEO)})


def step_inputs(family, vae, denoiser, seed: int, noise: NoiseOptions | None = None):
    """StepInputs of a DDPM run of ``family`` on the CPU in float32, without text encoders."""
    return StepInputs(
        denoiser=denoiser,
        vae=vae,
        family=family,
        objective=DDPMObjective(DDPMScheduler(), v_prediction=False),
        text_encoders=(),
        tokenizers=(),
        train_text_encoder=False,
        weight_dtype=torch.float32,
        device=torch.device("cpu"),
        seed=seed,
        noise=noise or NoiseOptions(),
    )


def hand_ddpm_loss(vae, denoiser, batch: dict, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, posterior mean) of a batch of pixels (images [B, 3, H, W] or clips
    [B, 3, F, H, W]) computed from the VAE's own encode, the keyed draw, the per-channel
    statistics of its config and DDPM's schedule: epsilon prediction, weighted by the batch's
    loss weights."""
    pixels = batch["pixel_values"]
    clips = pixels if pixels.dim() == 5 else pixels[:, :, None]
    with torch.no_grad():
        posterior = vae.encode(clips).latent_dist
        positions = batch["positions"].tolist()
        shape = tuple(posterior.mean.shape[1:])
        d = draw(seed, batch["epoch"], positions, shape, 1000, torch.device("cpu"))
        sample = posterior.mean + posterior.std * d.latent_eps
        mean_c, std_c = (
            torch.tensor(v).view(1, -1, 1, 1, 1)
            for v in (vae.config.latents_mean, vae.config.latents_std)
        )
        x0 = (sample - mean_c) / std_c
        a = DDPMScheduler().alphas_cumprod[d.timesteps].view(-1, 1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * d.noise
        per_sample = ((denoiser(xt) - d.noise) ** 2).mean(dim=(1, 2, 3, 4))
    return (per_sample * batch["loss_weights"]).mean(), posterior.mean


def latent_cache_of(data, vae, to_disk: bool, family=VIDEO):
    """The latent cache a run of ``family`` over ``vae`` builds for ``data`` on one CPU
    process."""
    config = SimpleNamespace(
        data=SimpleNamespace(latents_cached=True, cache_latents_to_disk=to_disk, vae_batch_size=2)
    )
    accelerator = SimpleNamespace(
        device=torch.device("cpu"), print=lambda *_: None, is_local_main_process=False
    )
    components = SimpleNamespace(family=family, vae=vae)
    return build_latent_cache(config, data, components, accelerator, CacheGroup.single())
