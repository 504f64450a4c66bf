"""Sample clips: a prompt with several frames (--f) becomes an animated WebP or an MP4 at the
family's frame rate plus a frame strip, its first frame (--i) reaches an image-to-video pipeline,
and an image model given either is refused before any sample.

The written files are read back with PIL and PyAV and compared with the frames the pipeline
returned, computed again here from the seed; the strip with those frames laid side by side.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import SimpleNamespace

import av
import numpy as np
import pytest
import torch
from PIL import Image, ImageSequence

from library.config.schema import SavingSection
from library.errors import ConfigError
from library.models.conditioning import Conditioning, TextConditioning
from library.models.families.base import ModelFamily
from library.models.families.sd.family import SD1
from library.models.latent_codec import LatentLayout
from library.sampling.clips import round_frames, strip_indices, write_clip
from library.sampling.generate import check_sampling, sample_images
from library.sampling.grid import is_sample_image, strip_path
from library.sampling.pipelines import PipelineKind
from library.sampling.prompts import SamplePrompt
from library.saving.outputs import OutputLayout

FPS = 12.0
FRAME_FACTOR = 4  # Wan's VAE: 1 + 4k frames


def clip_frames(seed: int, count: int, width: int, height: int) -> list[Image.Image]:
    """Smooth, moving test frames (a gradient sliding right, a colour drifting with the seed):
    what the stand-in pipeline returns, and what the tests expect back."""
    x = np.arange(width)[None, :]
    y = np.arange(height)[:, None]
    frames = []
    for t in range(count):
        red = (x * 4 + t * 9) % 256 + 0 * y
        green = np.broadcast_to((y * 5 + seed) % 256, red.shape)
        blue = np.full_like(red, (seed * 7 + t * 20) % 256)
        frames.append(Image.fromarray(np.stack([red, green, blue], -1).astype(np.uint8)))
    return frames


class StandInVideoPipeline:
    """A video pipeline's call shape (diffusers' WanPipeline: ``.frames`` of PIL lists): frames
    made from the generator's seed, so a test can compute them again."""

    def __init__(self):
        self.vae = self.text_encoder = torch.nn.Linear(1, 1)
        self.calls = []

    def __call__(self, *, width, height, num_frames, generator, **kw):
        self.calls.append(dict(kw, width=width, height=height, num_frames=num_frames))
        return SimpleNamespace(frames=[clip_frames(generator.initial_seed(), num_frames, width,
                                                   height)])  # fmt: skip


def _inputs(cond, prompt) -> dict:
    # as Wan's pipeline kind does: it asks for one frame; the prompt's count must win
    return {"prompt_embeds": cond.encoder_hidden_states[:1], "num_frames": 1}


@dataclass(frozen=True, kw_only=True)
class ClipFamily(ModelFamily):
    """A video family: clips of 1 + 4k frames at FPS; ``first_frame`` for image-to-video."""

    TRAINS_CLIPS = True
    FRAME_RATE = FPS
    LABEL = "Clip"
    first_frame: bool = False

    def latent_codec(self, vae):
        return SimpleNamespace(layout=LatentLayout(4, 8, (1,), FRAME_FACTOR))

    def sampling_pipeline(self):
        argument = "image" if self.first_frame else None
        return PipelineKind("WanPipeline", call_inputs=_inputs, first_frame_argument=argument)

    def encode_text(self, tokenizers, text_encoders, captions, device, *args, **kw):
        return TextConditioning(hidden=torch.zeros(len(captions), 1, 1, device=device))

    def assemble_conditioning(self, text, batch, device, dtype=None):
        return Conditioning(encoder_hidden_states=text.hidden)


CLIPS = ClipFamily(
    name="clips", prediction_type="flow", base_model_version="test",
    modelspec_architecture="test", default_resolution=32,
)  # fmt: skip


def components(family=CLIPS):
    module = torch.nn.Linear(1, 1)
    objective = SimpleNamespace(sampler=lambda name: SimpleNamespace(name=name))
    return SimpleNamespace(family=family, denoiser=module, text_encoders=(module,),
                           tokenizers=(None,), vae=module, objective=objective)  # fmt: skip


def prompt(index=0, frames=9, **kw) -> SamplePrompt:
    values = dict(index=index, prompt="a ball rolls", negative_prompt="", width=32, height=24,
                  seed=5 + index, steps=2, scale=1.0, sampler="euler", frames=frames)  # fmt: skip
    return SamplePrompt(**(values | kw))


@pytest.fixture
def pipe(monkeypatch):
    stand_in = StandInVideoPipeline()
    monkeypatch.setattr("library.sampling.generate._pipeline", lambda *args: stand_in)
    return stand_in


def rgb(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def webp_frames(path) -> tuple[list[np.ndarray], list[int]]:
    with Image.open(path) as clip:
        assert clip.format == "WEBP"
        frames = [(rgb(f), f.info["duration"]) for f in ImageSequence.Iterator(clip)]
    return [f for f, _ in frames], [d for _, d in frames]


def mp4_frames(path) -> tuple[list[np.ndarray], float]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        rate = float(stream.average_rate)
        frames = [f.to_ndarray(format="rgb24").astype(np.int16) for f in container.decode(stream)]
    return frames, rate


def test_a_webp_sample_is_the_pipeline_clip_exactly_with_its_strip(pipe, tmp_path):
    # 10 frames is not 1 + 4k: musubi-tuner's rule rounds it down to 9
    done = sample_images(components(), [prompt(frames=10)], step=3, output_dir=tmp_path,
                         output_name="run")  # fmt: skip
    (path,) = done.images
    assert path.name == "run_000003_00_5.webp" and pipe.calls[0]["num_frames"] == 9
    expected = [rgb(f) for f in clip_frames(5, 9, 32, 24)]
    frames, durations = webp_frames(path)
    assert len(frames) == 9 and all(np.array_equal(a, b) for a, b in zip(frames, expected, strict=True))
    assert all(abs(d - 1000 / FPS) <= 0.5 for d in durations)
    # the strip: the first, the last and two between, side by side, pixels unchanged
    shown = [expected[i] for i in (0, 3, 5, 8)]
    strip = rgb(Image.open(strip_path(path)))
    assert np.array_equal(strip, np.concatenate(shown, axis=1))
    grid = rgb(Image.open(done.grid))
    assert np.array_equal(grid, strip)  # the grid shows the strip of the one prompt
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "run_000003_00_5.webp", "run_000003_00_5_strip.png", "run_000003_grid.png",
    ]  # fmt: skip


def test_an_mp4_sample_plays_at_the_family_rate_within_codec_tolerance(pipe, tmp_path):
    done = sample_images(components(), [prompt(frames=5)], step=0, output_dir=tmp_path,
                         output_name="run", video_format="mp4")  # fmt: skip
    (path,) = done.images
    frames, rate = mp4_frames(path)
    expected = [rgb(f) for f in clip_frames(5, 5, 32, 24)]
    assert rate == pytest.approx(FPS) and len(frames) == 5
    for got, want in zip(frames, expected, strict=True):
        assert got.shape == want.shape and np.abs(got - want).mean() < 4
    strip = rgb(Image.open(strip_path(path)))
    assert np.array_equal(strip, np.concatenate([expected[i] for i in (0, 1, 3, 4)], axis=1))


def test_one_frame_is_an_image_and_a_resumed_round_rewrites_the_same_files(pipe, tmp_path):
    prompts = [prompt(0, frames=1), prompt(1, frames=5)]
    first = sample_images(components(), prompts, step=2, output_dir=tmp_path, output_name="r")
    names = sorted(p.name for p in first.images[0].parent.iterdir())
    again = sample_images(components(), prompts, step=2, output_dir=tmp_path, output_name="r")
    assert again.images == first.images
    assert sorted(p.name for p in first.images[0].parent.iterdir()) == names
    image, clip = first.images
    assert image.suffix == ".png" and np.array_equal(
        rgb(Image.open(image)), rgb(clip_frames(5, 1, 32, 24)[0]))  # fmt: skip
    assert clip.suffix == ".webp"
    # --overwrite sets every one of them aside (they are the run's samples) and nothing else
    (tmp_path / "sample" / "r_notes.txt").write_text("mine")
    saving = SavingSection(output_dir=str(tmp_path), output_name="r")
    _, samples = OutputLayout(saving).earlier_run()
    assert sorted(p.name for p in samples) == names


def test_sample_file_names_are_recognised():
    for name in ("r_000002_00_5.webp", "r_000002_00_5.mp4", "r_000002_01_-3_strip.png"):
        assert is_sample_image("r", name)
    for name in ("r_000002_00_5.gif", "r_000002_00_5_strip.webp", "x_000002_00_5.mp4"):
        assert not is_sample_image("r", name)


def test_an_image_to_video_prompt_hands_its_first_frame_cropped_to_the_size(pipe, tmp_path):
    wide = np.zeros((32, 64, 3), np.uint8)
    wide[:, 16:48] = (200, 40, 10)  # the middle square the crop keeps
    Image.fromarray(wide).save(tmp_path / "first.png")
    family = dataclasses.replace(CLIPS, first_frame=True)
    p = prompt(frames=5, width=32, height=32, first_frame=tmp_path / "first.png")
    sample_images(components(family), [p], step=0, output_dir=tmp_path, output_name="r")
    image = pipe.calls[0]["image"]
    assert image.size == (32, 32) and (rgb(image) == (200, 40, 10)).all()


def test_frames_or_a_first_frame_the_model_cannot_use_are_refused_before_sampling(tmp_path):
    image_family = SD1  # an image model: sampled by diffusers' SD pipeline
    first = tmp_path / "f.png"
    Image.new("RGB", (8, 8)).save(first)
    with pytest.raises(ConfigError, match=r"sample prompt 2 asks for 9 frames \(--f\).*--f"):
        check_sampling(components(image_family), [prompt(0, frames=1), prompt(1, frames=9)])
    check_sampling(components(image_family), [prompt(frames=1)])
    with pytest.raises(ConfigError, match=r"prompt 1 gives a first frame \(--i\).*remove"):
        check_sampling(components(), [prompt(first_frame=first)])
    i2v = components(dataclasses.replace(CLIPS, first_frame=True))
    with pytest.raises(ConfigError, match=r"prompt 1 gives no first frame.*--i"):
        check_sampling(i2v, [prompt()])
    check_sampling(i2v, [prompt(first_frame=first)])


def test_frame_counts_round_down_to_what_the_vae_takes():
    # musubi-tuner's rule, written out: (F - 1) // 4 * 4 + 1
    for frames, expected in ((1, 1), (2, 1), (5, 5), (8, 5), (80, 77), (81, 81)):
        assert round_frames(frames, 4) == expected
    assert round_frames(7, 0) == 7  # an image VAE has no frame axis to round to


def test_strip_frames_are_evenly_spaced_first_and_last_included():
    assert strip_indices(3) == [0, 1, 2]
    assert strip_indices(81) == [0, 27, 53, 80]


def test_write_clip_leaves_no_temporary_and_keeps_an_earlier_file_on_failure(tmp_path):
    frames = clip_frames(1, 3, 16, 16)
    path = tmp_path / "c.webp"
    path.write_bytes(b"earlier")
    with pytest.raises(AttributeError):  # a str has no pixels
        write_clip(path, [Image.new("RGB", (16, 16)), "not a frame"], FPS)
    assert path.read_bytes() == b"earlier" and sorted(tmp_path.iterdir()) == [path]
    write_clip(path, frames, FPS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.webp", "c_strip.png"]


EMBEDDING = torch.linspace(-1, 1, 32).reshape(1, 4, 8)  # a caption's stand-in text states


def _wan_inputs(cond, prompt) -> dict:
    embeds, negative = cond.encoder_hidden_states.chunk(2)
    return {"prompt_embeds": embeds, "negative_prompt_embeds": negative,
            "guidance_scale": prompt.scale, "num_frames": 1}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class TinyWanFamily(ClipFamily):
    """Samples through diffusers' own WanPipeline; a caption is EMBEDDING, the empty one zeros."""

    def sampling_pipeline(self):
        if not self.first_frame:
            return PipelineKind("WanPipeline", denoiser_argument="transformer",
                                call_inputs=_wan_inputs)  # fmt: skip
        # Wan 2.2's image-to-video: the first frame's latents alone, no CLIP image encoder
        return PipelineKind(
            "WanImageToVideoPipeline", {"image_encoder": None, "image_processor": None},
            denoiser_argument="transformer", call_inputs=_wan_inputs, first_frame_argument="image",
        )  # fmt: skip

    def encode_text(self, tokenizers, text_encoders, captions, device, *args, **kw):
        rows = [EMBEDDING[0] if caption else torch.zeros(4, 8) for caption in captions]
        return TextConditioning(hidden=torch.stack(rows).to(device))


def tiny_wan_pipeline(first_frame: bool = False):
    """A tiny WanPipeline (WanImageToVideoPipeline with ``first_frame``) and Components that
    sample through the same module objects."""
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanImageToVideoPipeline,
        WanPipeline,
        WanTransformer3DModel,
    )

    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=4, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4,
    )  # fmt: skip
    transformer = WanTransformer3DModel(
        # image-to-video: noise, the first frame's mask (4 frames a latent) and its latents
        in_channels=12 if first_frame else 4,
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
        out_channels=4, text_dim=8, freq_dim=16, ffn_dim=16, num_layers=1, rope_max_seq_len=32,
    )  # fmt: skip
    from transformers import UMT5Config, UMT5EncoderModel

    # never run (the family encodes the captions): a pipeline's modules tell it its device
    encoder = UMT5EncoderModel(UMT5Config(vocab_size=8, d_model=8, d_kv=4, num_heads=2,
                                          num_layers=1, d_ff=8))  # fmt: skip
    scheduler = lambda name: FlowMatchEulerDiscreteScheduler(shift=3.0)  # noqa: E731
    modules = dict(tokenizer=None, text_encoder=encoder, vae=vae, transformer=transformer,
                   scheduler=scheduler(None))  # fmt: skip
    if first_frame:
        pipe = WanImageToVideoPipeline(**modules, image_encoder=None, image_processor=None)
    else:
        pipe = WanPipeline(**modules)
    pipe.set_progress_bar_config(disable=True)
    components = SimpleNamespace(
        family=TinyWanFamily(name="tiny-wan", prediction_type="flow", base_model_version="t",
                             modelspec_architecture="t", default_resolution=32,
                             first_frame=first_frame),
        denoiser=transformer, text_encoders=(pipe.text_encoder,), tokenizers=(None,), vae=vae,
        objective=SimpleNamespace(sampler=scheduler),
    )  # fmt: skip
    return pipe, components


def pipeline_clip(pipe, seed: int, **call) -> np.ndarray:
    """The pipeline called directly, as its users call it, for numbers: a 32 x 32 clip of 2
    steps at guidance 2 from EMBEDDING; its frames in 8 bits as diffusers rounds them."""
    video = pipe(
        prompt_embeds=EMBEDDING, negative_prompt_embeds=torch.zeros(1, 4, 8), guidance_scale=2.0,
        width=32, height=32, num_inference_steps=2, generator=torch.Generator().manual_seed(seed),
        output_type="np", **call,
    ).frames[0]  # fmt: skip
    return (video * 255).round().astype(np.int16)


def test_a_clip_sampled_through_wan_pipeline_is_the_pipeline_own_clip(tmp_path):
    pipe, parts = tiny_wan_pipeline()
    p = prompt(frames=10, width=32, height=32, scale=2.0, steps=2)
    done = sample_images(parts, [p], step=1, output_dir=tmp_path, output_name="w")
    expected = pipeline_clip(pipe, p.seed, num_frames=9)  # 10 frames rounded down
    frames, _ = webp_frames(done.images[0])
    assert len(frames) == 9 and np.abs(expected).max() > 0
    assert all(np.array_equal(a, b) for a, b in zip(frames, expected, strict=True))


def test_an_image_to_video_sample_is_the_pipeline_own_clip_from_the_cropped_first_frame(tmp_path):
    pipe, parts = tiny_wan_pipeline(first_frame=True)
    rng = np.random.default_rng(0)
    wide = rng.integers(0, 256, (32, 64, 3), dtype=np.uint8)
    Image.fromarray(wide).save(tmp_path / "start.png")
    p = prompt(frames=5, width=32, height=32, scale=2.0, first_frame=tmp_path / "start.png")
    check_sampling(parts, [p])
    done = sample_images(parts, [p], step=0, output_dir=tmp_path, output_name="i")
    # the middle square: the first frame covered and center-cropped
    expected = pipeline_clip(pipe, p.seed, num_frames=5, image=Image.fromarray(wide[:, 16:48]))
    frames, _ = webp_frames(done.images[0])
    assert all(np.array_equal(a, b) for a, b in zip(frames, expected, strict=True))
