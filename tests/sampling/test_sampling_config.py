"""The [sampling] section: kohya's keys load into it, bad values are errors, it renders back."""

from __future__ import annotations

import pytest

from library.config.loader import load_config
from library.config.render import render_toml
from library.config.sampling_schema import SamplingSection
from library.config.schema import Section
from library.errors import ConfigError

HEAD = 'pretrained_model_name_or_path = "m"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'


def config_with(tmp_path, text: str):
    path = tmp_path / "c.toml"
    path.write_text(HEAD + text + DATASET, encoding="utf-8")
    return load_config(str(path))


def test_kohya_keys_load_into_the_sampling_section(tmp_path):
    (tmp_path / "p.txt").write_text("a dog --w 256\n", encoding="utf-8")
    config = config_with(
        tmp_path,
        "[sample_prompt_arguments]\n"
        f'sample_prompts = "{tmp_path / "p.txt"}"\n'
        'sample_every_n_steps = 50\nsample_at_first = true\nsample_sampler = "k_euler_a"\n',
    )
    assert config.sampling == SamplingSection(
        sample_prompts=str(tmp_path / "p.txt"),
        sample_every_n_steps=50,
        sample_at_first=True,
        sample_sampler="k_euler_a",
    )
    assert SamplingSection.model_config == Section.model_config  # the same strict rules


def test_bad_sampler_in_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match='"sample_sampler" = "euler_ancestral" is not valid'):
        config_with(tmp_path, 'sample_sampler = "euler_ancestral"\n')


def test_sampling_keys_render_and_load_back(tmp_path):
    config = config_with(
        tmp_path,
        'sample_prompts = "p.json"\nsample_every_n_epochs = 2\nsample_width = 768\n'
        "sample_scale = 5\nsample_seed = 3\n",
    )
    assert config.sampling.sample_scale == 5.0 and config.sampling.sample_width == 768
    text = render_toml(config)
    assert "[sampling]" in text
    again = tmp_path / "again.toml"
    again.write_text(text, encoding="utf-8")
    assert load_config(str(again)) == config


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("sample_width = 32", '"sample_width" = 32 is not valid: expected a whole number >= 64'),
        ("sample_steps = 0", '"sample_steps" = 0 is not valid'),
        ('sample_every_n_steps = "10"', '"sample_every_n_steps" = "10" is not valid'),
        ("sample_every_n_epoch = 1", 'did you mean "sample_every_n_epochs"?'),
    ],
)
def test_bad_sampling_values(tmp_path, line, message):
    with pytest.raises(ConfigError) as info:
        config_with(tmp_path, line + "\n")
    assert message in str(info.value)
