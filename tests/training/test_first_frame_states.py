"""An image encoder's states of each sample's first frame (Wan 2.1 I2V-14B's CLIP states),
through the shared data path: the cached states are the encoder's penultimate states of the
clip's first decoded frame as an 8-bit image, cached and uncached batches agree, the entries are
keyed by the encoder (another encoder's are never taken) and a missing or foreign file is
encoded again."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.cache_group import CacheGroup
from library.data.dataset import TrainData
from library.data.latent_cache import cache_file
from library.data.samples import SampleSource, image_state_requests
from library.data.video_decode import decode_frames
from library.models.families.base import FIRST_FRAME_IMAGE_STATES_KEY
from library.models.image_encoders.clip_vision import ImageEncoder
from library.training.caching import build_image_state_cache
from library.training.step import with_image_states
from tests.kits import videos as kit
from tests.kits.video_latents import FIRST_FRAME, step_inputs
from tests.kits.wan.tiny import clip_vision_config, image_processor_config

SIZE = (64, 64)  # (width, height)


def _encoder(seed: int) -> ImageEncoder:
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    torch.manual_seed(seed)
    model = CLIPVisionModel(CLIPVisionConfig(**clip_vision_config())).eval()
    return ImageEncoder(model, CLIPImageProcessor(**image_processor_config()))


@pytest.fixture(scope="module")
def encoder():
    return _encoder(0)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    kit.write_video(folder / "a.mp4", kit.moving_square(9, SIZE))
    kit.write_video(folder / "b.mp4", kit.moving_square(9, SIZE, reverse=True))
    subset = SubsetConfig(video_directory=str(folder), target_frames=[5], class_tokens="sq")
    return TrainData([DatasetConfig(batch_size=2, resolution=list(SIZE), subsets=[subset])], 3)


def _cache(data, encoder, to_disk: bool):
    config = SimpleNamespace(data=SimpleNamespace(latents_cached=True, vae_batch_size=2,
                                                  cache_latents_to_disk=to_disk))  # fmt: skip
    accelerator = SimpleNamespace(device=torch.device("cpu"), print=lambda *_: None,
                                  is_local_main_process=False)  # fmt: skip
    components = SimpleNamespace(image_encoder=encoder)
    return build_image_state_cache(config, data, components, accelerator, CacheGroup.single())


def _states_of(encoder, path, frame) -> torch.Tensor:
    """The tower's penultimate states of the decoded frame as an RGB image (the pipeline's
    encode_image)."""
    (pixels,) = decode_frames(path, [frame])
    inputs = encoder.processor(images=[Image.fromarray(np.asarray(pixels))], return_tensors="pt")
    with torch.no_grad():
        return encoder.model(**inputs, output_hidden_states=True).hidden_states[-2][0]


@pytest.mark.parametrize("to_disk", [False, True], ids=["memory", "disk"])
def test_cached_states_are_the_encoders_of_the_first_frame(clips, encoder, to_disk):
    cache = _cache(clips, encoder, to_disk)
    requests = image_state_requests(clips)
    assert len(requests) == 2 and all(len(r.frames) == 1 for r in requests)
    for request in requests:
        expected = _states_of(encoder, request.path, request.frames[0])
        torch.testing.assert_close(cache.get(request).mean, expected, rtol=1e-5, atol=1e-5)


def test_cached_and_uncached_batches_give_the_same_states(clips, encoder):
    from diffusers import AutoencoderKLQwenImage

    from tests.kits.qwenimage.tiny_shapes import tiny_vae_config
    from tests.kits.video_latents import VIDEO, latent_cache_of

    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(**tiny_vae_config()).eval()
    latents = latent_cache_of(clips, vae, False, FIRST_FRAME)
    source = SampleSource(latents, 1, VIDEO.latent_codec(vae).layout, first_frame=True,
                          image_states=_cache(clips, encoder, False), image_state_shape=(5, 16))  # fmt: skip
    (cached,) = list(clips.loader(0, 0, source=source))
    (pixels,) = list(clips.loader(0, 0))
    inputs = step_inputs(FIRST_FRAME, vae, torch.nn.Identity(), seed=1)
    inputs.image_encoder = encoder
    from_cache = with_image_states(inputs, cached)[FIRST_FRAME_IMAGE_STATES_KEY]
    from_pixels = with_image_states(inputs, pixels)[FIRST_FRAME_IMAGE_STATES_KEY]
    assert from_cache.shape == (2, 5, 16) and not torch.allclose(from_cache[0], from_cache[1])
    torch.testing.assert_close(from_cache, from_pixels, rtol=1e-5, atol=1e-5)


def test_entries_are_keyed_by_the_encoder_and_rebuilt_when_missing_or_foreign(clips, encoder):
    cache = _cache(clips, encoder, True)
    other = _cache(clips, _encoder(1), True)
    first, second = image_state_requests(clips)
    assert cache.key(first) != other.key(first)  # another encoder's states are never taken
    before = cache.get(first).mean.clone()
    assert not torch.allclose(before, other.get(first).mean)
    file = cache_file(first.root, cache.key(first))
    file.write_bytes(cache_file(second.root, cache.key(second)).read_bytes())
    with pytest.raises(Exception, match="not made for"):
        cache.get(first)
    torch.testing.assert_close(_cache(clips, encoder, True).get(first).mean, before)
    file.unlink()
    torch.testing.assert_close(_cache(clips, encoder, True).get(first).mean, before)
