"""Prompts files: kohya's .txt options, .toml and .json layouts, defaults, seeds and errors."""

from __future__ import annotations

import hashlib
import json

import pytest
from PIL import Image

from library.config.sampling_schema import SamplingSection
from library.errors import ConfigError
from library.sampling.prompts import SamplePrompt, derive_seed, load_prompts

DEFAULTS = SamplingSection()  # kohya's defaults: 512 x 512, 30 steps, scale 7.5, ddim


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(path, sampling=DEFAULTS, seed=42):
    return load_prompts(path, sampling, seed)


def expected_seed(base: int, index: int) -> int:
    # Written out independently of the module: first 4 bytes of a SHA-256, big-endian.
    digest = hashlib.sha256(f"difftune-sample:{base}:{index}".encode()).digest()
    return digest[0] << 24 | digest[1] << 16 | digest[2] << 8 | digest[3]


def test_txt_options_comments_and_defaults(tmp_path):
    path = write(
        tmp_path,
        "p.txt",
        "# my prompts\n"
        "\n"
        "a photo of sks dog on the beach --n blurry, low quality --w 768 --h 520 --d 42 --s 28"
        " --l 7 --ss euler_a\n"
        "   # an indented comment\n"
        "a cat #1 in a hat\n"
        "a flux prompt --g 3.5 --w 1024\n",
    )
    first, second, third = load(path)
    assert first == SamplePrompt(
        index=0,
        prompt="a photo of sks dog on the beach",
        negative_prompt="blurry, low quality",
        width=768,
        height=520,
        seed=42,
        steps=28,
        scale=7.0,
        sampler="euler_a",
    )
    # A "#" inside a prompt is text; only whole lines are comments. Defaults fill the rest;
    # scale and sampler stay unset (None): the model picks them (7.5 / ddim for SD).
    assert second == SamplePrompt(
        1, "a cat #1 in a hat", "", 512, 512, expected_seed(42, 1), 30, None, None
    )
    # kohya's --g: FLUX.1 dev's distilled guidance
    assert third.guidance_scale == 3.5 and third.width == 1024 and third.scale is None


def test_options_in_any_order_and_case(tmp_path):
    path = write(tmp_path, "p.txt", "a dog --L 4.5 --W 640 --SS dpmsolver++ --n  two  words \n")
    (p,) = load(path)
    assert (p.scale, p.width, p.sampler, p.negative_prompt) == (
        4.5,
        640,
        "dpmsolver++",
        "two  words",
    )


def test_sizes_round_down_to_multiples_of_8_with_a_floor_of_64(tmp_path):
    path = write(tmp_path, "p.txt", "a --w 517 --h 40\nb --w 64 --h 1023\n")
    a, b = load(path)
    assert (a.width, a.height) == (512, 64)
    assert (b.width, b.height) == (64, 1016)


def test_section_defaults_apply(tmp_path):
    sampling = SamplingSection(
        sample_width=256, sample_height=320, sample_steps=12, sample_scale=3.0,
        sample_sampler="euler", sample_seed=5,
    )  # fmt: skip
    (p,) = load(write(tmp_path, "p.txt", "x\n"), sampling, seed=999)
    assert p == SamplePrompt(0, "x", "", 256, 320, expected_seed(5, 0), 12, 3.0, "euler")


def test_derived_seeds_depend_on_run_seed_and_index_only(tmp_path):
    path = write(tmp_path, "p.txt", "a\nb\nc --d 7\n")
    seeds = [p.seed for p in load(path, seed=3)]
    assert seeds == [expected_seed(3, 0), expected_seed(3, 1), 7]
    assert [p.seed for p in load(path, seed=3)] == seeds  # the same every round
    assert [p.seed for p in load(path, seed=4)][:2] != seeds[:2]
    assert derive_seed(3, 0) == expected_seed(3, 0)


def test_toml_prompt_defaults_and_subsets(tmp_path):
    path = write(
        tmp_path,
        "p.toml",
        """
[prompt]
negative_prompt = "lowres"
width = 640
sample_steps = 20
scale = 5

  [[prompt.subset]]
  prompt = "a dog"
  seed = 1

  [[prompt.subset]]
  prompt = "a cat"
  width = 448
  negative_prompt = "blurry"
  sample_sampler = "k_euler"
""",
    )
    dog, cat = load(path)
    assert dog == SamplePrompt(0, "a dog", "lowres", 640, 512, 1, 20, 5.0, None)
    # The entry's own keys win over [prompt].
    assert cat == SamplePrompt(
        1, "a cat", "blurry", 448, 512, expected_seed(42, 1), 20, 5.0, "k_euler"
    )


def test_json_objects_and_lines(tmp_path):
    data = [
        {"prompt": "a dog", "height": 768, "seed": 3, "scale": 6.5, "sample_sampler": "heun"},
        "a cat --w 320 --d 9",
    ]
    dog, cat = load(write(tmp_path, "p.json", json.dumps(data)))
    assert dog == SamplePrompt(0, "a dog", "", 512, 768, 3, 30, 6.5, "heun")
    assert cat == SamplePrompt(1, "a cat", "", 320, 512, 9, 30, None, None)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("a dog --x 3", "line 2: unknown option --x; known: --n --w --h --d --s --l --ss"),
        ("a dog --ww 512", 'line 2: unknown option --ww; did you mean "--w"?'),
        ("a dog --w big", "line 2: --w 'big' is not a whole number"),
        ("a dog --l 7,5", "line 2: --l '7,5' is not a number"),
        ("a dog --n", "line 2: option --n has no value"),
        ("a dog --w 512 --w 640", "line 2: option --w is given twice"),
        ("a dog --s 0", "line 2: sample steps 0 must be between 1 and 1000"),
        ("a dog --ss eular_a", "line 2: unknown sampler 'eular_a'; did you mean \"euler_a\"?"),
        ("a dog --cn pose.png", "line 2: --cn is not supported (ControlNet"),
        ("--w 512", "line 2: the prompt is empty"),
    ],
)
def test_txt_errors_name_file_and_line(tmp_path, line, message):
    path = write(tmp_path, "p.txt", f"fine\n{line}\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    text = str(info.value)
    assert text.startswith(f"sample_prompts {path}, ") and message in text
    assert "\n" not in text


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[prompt]\nwidth = 512\n", "expected a [prompt] table with [[prompt.subset]] entries"),
        (
            '[[prompt.subset]]\nprompt = "a"\nwidht = 5\n',
            'subset]] 1: unknown key "widht"; did you mean "width"?',
        ),
        (
            '[[prompt.subset]]\nprompt = "a"\nwidth = "5"\n',
            "subset]] 1: \"width\" = '5' is not a whole number",
        ),
        ('[[prompt.subset]]\nprompt = "a"\nseed = true\n', '"seed" = True is not a whole number'),
        (
            '[prompt]\nsampler = "x"\n[[prompt.subset]]\nprompt = "a"\n',
            '[prompt]: unknown key "sampler"',
        ),
        ('[[prompt.subset]]\nprompt = "a"\n[other]\n', 'unknown table or key "other"'),
        ("[prompt\n", "not valid TOML"),
    ],
)
def test_toml_errors(tmp_path, body, message):
    path = write(tmp_path, "p.toml", body)
    with pytest.raises(ConfigError, match=None) as info:
        load(path)
    assert str(info.value).startswith(f"sample_prompts {path}") and message in str(info.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"prompt": "a"}', "expected a JSON list of prompts"),
        ("[3]", "entry 1: expected an object or a string"),
        ('[{"prompt": "a", "steps": 3}]', 'entry 1: unknown key "steps"'),
        ('[{"prompt": "a", "width": -8}]', 'entry 1: "width" must not be negative'),
        ('[{"negative_prompt": "a"}]', "entry 1: the prompt is empty"),
        ('[\n{"prompt": "a",}\n]', "line 2: not valid JSON"),
    ],
)
def test_json_errors(tmp_path, body, message):
    path = write(tmp_path, "p.json", body)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"sample_prompts {path}") and message in str(info.value)


def test_file_level_errors(tmp_path):
    with pytest.raises(ConfigError, match="sample_prompts file not found: .*nope.txt"):
        load(tmp_path / "nope.txt")
    with pytest.raises(ConfigError, match=r"use a \.txt, \.toml or \.json file"):
        load(write(tmp_path, "p.yaml", "a"))
    with pytest.raises(ConfigError, match="has no prompts"):
        load(write(tmp_path, "p.txt", "# only a comment\n\n"))
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\xfa a dog\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load(tmp_path / "bad.txt")


def test_utf8_bom_is_ignored(tmp_path):
    (tmp_path / "p.txt").write_bytes("\ufeffa dog --w 256\n".encode())
    (p,) = load(tmp_path / "p.txt")
    assert (p.prompt, p.width) == ("a dog", 256)


def test_video_options_frame_count_and_first_frame(tmp_path):
    # musubi-tuner's words: --f / frame_count for the clip's frames, --i / image_path for an
    # image-to-video model's first frame (relative to the prompts file's folder)
    Image.new("RGB", (8, 8)).save(tmp_path / "start.png")
    txt = write(tmp_path, "p.txt", "a ball rolls --f 33 --i start.png\na still photo\n")
    clip, still = load(txt)
    assert (clip.frames, clip.first_frame) == (33, tmp_path / "start.png")
    assert (still.frames, still.first_frame) == (1, None)
    toml = write(
        tmp_path, "p.toml",
        '[prompt]\nframe_count = 17\n[[prompt.subset]]\nprompt = "a"\nimage_path = "start.png"\n'
        '[[prompt.subset]]\nprompt = "b"\nframe_count = 1\n',
    )  # fmt: skip
    a, b = load(toml)
    assert (a.frames, a.first_frame, b.frames, b.first_frame) == (
        17, tmp_path / "start.png", 1, None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("a dog --f 0", "line 1: the frame count --f 0 must be at least 1"),
        ("a dog --f many", "line 1: --f 'many' is not a whole number"),
        ("a dog --i nowhere.png", r"line 1: --i nowhere.png: no image at"),
    ],
)
def test_video_option_errors(tmp_path, line, message):
    path = write(tmp_path, "p.txt", line + "\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert message in str(info.value) and "\n" not in str(info.value)
