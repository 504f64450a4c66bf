"""Sample prompts' text states encoded ahead (library/sampling/texts.py, for fsdp_text_encoder):
a round drawn from them equals one that encodes the prompts itself, and calls no text encoder."""

from __future__ import annotations

import pytest
import torch
from sampling_helpers import load, pixels, prompt

from library.models.conditioning import encode_conditioning, plain_sizes
from library.sampling.generate import sample_images
from library.sampling.runner import SampleRunner
from library.sampling.texts import encode_sample_texts, text_encoder
from tests.kits.flux2.tiny import write_tiny_flux2_folder


def _round(components, prompts, folder, texts=None):
    done = sample_images(components, prompts, step=0, output_dir=folder, output_name="s",
                         texts=texts)  # fmt: skip
    return [pixels(path) for path in done.images]


class _Refused(Exception):
    pass


def _refuse(module, args, kwargs):
    raise _Refused


def _prompts(sampler: str | None, **size):
    return [
        prompt(0, "a red square", negative_prompt="blurry", sampler=sampler, **size),
        prompt(1, "a green circle", sampler=sampler, seed=3, **size),
        prompt(2, "a red square", negative_prompt="blurry", sampler=sampler, seed=9, **size),
    ]


@pytest.fixture
def flux2_dev(tmp_path):
    return load(write_tiny_flux2_folder(tmp_path / "flux2", "dev"))


@pytest.mark.parametrize(
    ("model", "prompts"),
    [
        ("sd", _prompts("ddim", width=64, height=64)),
        ("flux2", _prompts(None, width=64, height=48)),  # caption lengths and sizes
    ],
)
def test_precomputed_texts_draw_the_same_images(model, prompts, request, tmp_path):
    components = request.getfixturevalue("components" if model == "sd" else "flux2_dev")
    encode = text_encoder(components, components.text_encoders, "cpu")
    states = encode_sample_texts(prompts, encode)
    assert len(states) == 2  # the repeated prompt is encoded once
    for p in prompts:  # the conditioning a round assembles, against encode_conditioning's
        texts, batch = [p.prompt, p.negative_prompt], plain_sizes(2, p.height, p.width)
        want = encode_conditioning(components.family, components.tokenizers,
                                   components.text_encoders, texts, "cpu", batch=batch)  # fmt: skip
        got = components.family.assemble_conditioning(
            states[(p.prompt, p.negative_prompt)], batch, "cpu", None
        )
        assert torch.equal(got.encoder_hidden_states, want.encoder_hidden_states)
    expected = _round(components, prompts, tmp_path / "plain")
    hooks = [m.register_forward_pre_hook(_refuse, with_kwargs=True)
             for m in components.text_encoders]  # fmt: skip
    try:
        with pytest.raises(_Refused):  # the hooks do stop a round that encodes
            _round(components, prompts[:1], tmp_path / "refused")
        drawn = _round(components, prompts, tmp_path / "ahead", states)
    finally:
        for hook in hooks:
            hook.remove()
    assert all((a == b).all() for a, b in zip(drawn, expected, strict=True))


def test_a_prompt_without_states_is_an_error_not_an_encoding(components, tmp_path):
    encode = text_encoder(components, components.text_encoders, "cpu")
    states = encode_sample_texts([prompt(0, "a red square")], encode)
    with pytest.raises(RuntimeError, match="sample prompt 2's texts were not encoded"):
        _round(components, [prompt(1, "a blue line")], tmp_path, states)


def test_the_runner_samples_from_the_states_it_encoded(components, tmp_path):
    """SampleRunner.encode_texts (what the trainer calls with the sharded copies after the
    cache fill): the prompts file, read once, encoded then; rounds use those states."""
    file = tmp_path / "prompts.txt"
    file.write_text("a red square --n blurry --w 64 --h 64 --d 5 --s 2\n", encoding="utf-8")
    from library.config.schema import Config

    config = Config(
        model={"pretrained_model_name_or_path": "unused"},
        saving={"output_dir": str(tmp_path / "out"), "output_name": "r"},
        sampling={"sample_prompts": str(file)},
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )
    runner = SampleRunner(config)
    runner.attach(components)
    expected = pixels(runner._sample(0).images[0])
    runner.encode_texts(components, components.text_encoders)
    assert list(runner.texts) == [("a red square", "blurry")]
    file.write_text("something else --w 64 --h 64\n", encoding="utf-8")  # read once: no effect
    hook = components.text_encoders[0].register_forward_pre_hook(_refuse, with_kwargs=True)
    try:
        drawn = pixels(runner._sample(1).images[0])
    finally:
        hook.remove()
    assert (drawn == expected).all()
