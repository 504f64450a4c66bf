"""A video dataset given to a family that trains on images alone is refused while the plan is
made, in one line naming the key and the fix, before any weight or video is read; a family that
trains on clips takes it."""

from __future__ import annotations

import pytest

from library.config.loader import load_config
from library.errors import ConfigError
from library.models.families.sd.family import SDFamily
from library.training.reference_checks import check_clip_config


def _config(tmp_path, model_dir, subset: str):
    path = tmp_path / "run.toml"
    path.write_text(
        f"pretrained_model_name_or_path = {str(model_dir)!r}\n"
        f"[[datasets]]\n[[datasets.subsets]]\n{subset}\n"
    )
    return load_config(str(path))


@pytest.mark.parametrize("key", ["video_directory", "video_jsonl_file"])
def test_an_image_family_refuses_a_video_dataset_by_its_key(tmp_path, tiny_model_dir, key):
    config = _config(tmp_path, tiny_model_dir, f'{key} = "nowhere/clips"')
    with pytest.raises(ConfigError) as caught:
        check_clip_config(config)  # the folder does not exist: nothing was read
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"datasets[0].subsets[0].{key} = nowhere/clips: an SD")
    assert "learns from images, not video clips; remove the video dataset" in message


def test_images_pass_and_a_family_that_trains_clips_takes_videos(
    tmp_path, tiny_model_dir, monkeypatch
):
    check_clip_config(_config(tmp_path, tiny_model_dir, 'image_dir = "nowhere/images"'))
    videos = _config(tmp_path, tiny_model_dir, 'video_directory = "nowhere/clips"')
    monkeypatch.setattr(SDFamily, "TRAINS_CLIPS", True)
    check_clip_config(videos)


def test_a_clip_family_gives_its_frame_rate(tmp_path, tiny_model_dir, monkeypatch):
    videos = _config(tmp_path, tiny_model_dir, 'video_directory = "nowhere/clips"')
    monkeypatch.setattr(SDFamily, "TRAINS_CLIPS", True)
    monkeypatch.setattr(SDFamily, "FRAME_RATE", 24.0)
    assert check_clip_config(videos) == 24.0


@pytest.mark.parametrize("key", ["video_directory", "video_jsonl_file"])
def test_a_video_source_is_an_input_the_run_never_writes_over(tmp_path, tiny_model_dir, key):
    from library.training.preflight import run_inputs

    config = _config(tmp_path, tiny_model_dir, f'{key} = "data/clips"')
    assert (f"datasets[0].subsets[0].{key}", "data/clips") in run_inputs(config)


def test_a_sample_prompt_asking_an_image_family_for_frames_is_refused_before_any_weight(
    tmp_path, tiny_model_dir, monkeypatch
):
    from library.sampling.prompts import load_prompts
    from library.training.reference_checks import check_sample_frames

    config = _config(tmp_path, tiny_model_dir, 'image_dir = "nowhere/images"')
    (tmp_path / "prompts.txt").write_text("a still\na ball rolls --f 17\n")
    prompts = load_prompts(tmp_path / "prompts.txt", config.sampling, 1)
    with pytest.raises(ConfigError) as caught:
        check_sample_frames(config, prompts)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("sample prompt 2 asks for 17 frames (--f) and SD models make")
    check_sample_frames(config, prompts[:1])
    monkeypatch.setattr(SDFamily, "TRAINS_CLIPS", True)
    check_sample_frames(config, prompts)
