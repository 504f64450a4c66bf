"""The sampling cadence, the SampleRunner the trainer holds, and images sent to tensorboard."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from sampling_helpers import pixels, prompt

import library.sampling.runner as runner_module
from library.config.loader import load_config
from library.config.sampling_schema import SamplingSection
from library.errors import ConfigError
from library.models.families.sd.family import SD1, SDXL
from library.sampling.runner import SampleRunner, due_after_epoch, due_after_step

HEAD = 'pretrained_model_name_or_path = "m"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'
# An objective whose samplers are all usable: the runner's own checks are under test here.
_SAMPLES = SimpleNamespace(sampler=lambda name: None)


def config_with(tmp_path, text: str):
    path = tmp_path / "c.toml"
    path.write_text(
        HEAD + f'output_dir = "{tmp_path / "out"}"\n' + text + DATASET, encoding="utf-8"
    )
    return load_config(str(path))


def test_due_helpers():
    steps = SamplingSection(sample_every_n_steps=3)
    assert [s for s in range(0, 10) if due_after_step(steps, s)] == [3, 6, 9]
    epochs = SamplingSection(sample_every_n_epochs=2)
    assert [e for e in range(0, 7) if due_after_epoch(epochs, e)] == [2, 4, 6]
    for off in (
        SamplingSection(),
        SamplingSection(sample_every_n_steps=0, sample_every_n_epochs=0),
    ):
        assert not any(due_after_step(off, s) or due_after_epoch(off, s) for s in range(1, 9))


def recording_runner(tmp_path, monkeypatch, keys: str):
    (tmp_path / "p.txt").write_text("a\nb\n", encoding="utf-8")
    config = config_with(tmp_path, f'sample_prompts = "{tmp_path / "p.txt"}"\n{keys}')
    rounds = []
    monkeypatch.setattr(
        runner_module, "sample_images", lambda comps, prompts, *, step, **kw: rounds.append(step)
    )
    runner = SampleRunner(config)
    runner.attach(components=SimpleNamespace(family=SD1, objective=_SAMPLES))
    return runner, rounds


def simulate(runner, epochs: int = 2, steps_per_epoch: int = 2, start: int = 0) -> None:
    """The calls the trainer makes, in its order."""
    step = start
    runner.at_start(step)
    for epoch in range(start // steps_per_epoch, epochs):
        while step < (epoch + 1) * steps_per_epoch:
            step += 1
            runner.after_step(step)
        runner.after_epoch(epoch + 1, step)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        (
            "sample_every_n_steps = 2\nsample_every_n_epochs = 1\nsample_at_first = true\n",
            [0, 2, 4],
        ),
        ("sample_every_n_epochs = 1\n", [2, 4]),
        ("sample_every_n_epochs = 2\n", [4]),
        ("sample_every_n_steps = 3\n", [3]),
        ("sample_at_first = true\n", [0]),
        ("", []),
    ],
)
def test_runner_cadence_samples_each_step_once(tmp_path, monkeypatch, keys, expected):
    runner, rounds = recording_runner(tmp_path, monkeypatch, keys)
    simulate(runner)
    assert rounds == expected


def test_runner_on_resume_samples_first_at_the_resumed_step(tmp_path, monkeypatch):
    runner, rounds = recording_runner(
        tmp_path, monkeypatch, "sample_every_n_steps = 2\nsample_at_first = true\n"
    )
    simulate(runner, epochs=3, start=2)
    assert rounds == [2, 4, 6]


def test_runner_reads_the_prompts_file_at_once(tmp_path):
    (tmp_path / "p.txt").write_text("a --q 1\n", encoding="utf-8")
    config = config_with(tmp_path, f'sample_prompts = "{tmp_path / "p.txt"}"\n')
    with pytest.raises(ConfigError, match=r"p.txt, line 1: unknown option --q"):
        SampleRunner(config)
    runner = SampleRunner(config_with(tmp_path, ""))
    assert not runner.enabled and runner.after_step(1) is None


def test_runner_needs_components_before_sampling(tmp_path):
    (tmp_path / "p.txt").write_text("a\n", encoding="utf-8")
    keys = f'sample_prompts = "{tmp_path / "p.txt"}"\nsample_every_n_steps = 1\n'
    runner = SampleRunner(config_with(tmp_path, keys))
    with pytest.raises(RuntimeError, match="attach"):
        runner.after_step(1)


def test_images_are_logged_to_tensorboard(components, tmp_path, fresh_accelerate):
    from accelerate import Accelerator
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from library.sampling.generate import sample_images

    accelerator = Accelerator(cpu=True, log_with="tensorboard", project_dir=str(tmp_path / "logs"))
    accelerator.init_trackers("run")
    prompts = [prompt(0), prompt(1, width=96)]
    result = sample_images(
        components, prompts, step=5, output_dir=tmp_path, output_name="r", accelerator=accelerator
    )
    accelerator.end_training()
    events = EventAccumulator(str(tmp_path / "logs" / "run"), size_guidance={"images": 0})
    events.Reload()
    assert sorted(events.Tags()["images"]) == ["sample/00", "sample/01"]
    (logged,) = events.Images("sample/01")
    assert (logged.step, logged.width, logged.height) == (5, 96, 64)
    assert pixels(result.images[1]).shape == (64, 96, 3)


def test_attach_checks_the_family_only_when_sampling_is_on(tmp_path):
    (tmp_path / "p.txt").write_text("a\n", encoding="utf-8")
    runner = SampleRunner(config_with(tmp_path, f'sample_prompts = "{tmp_path / "p.txt"}"\n'))
    runner.attach(SimpleNamespace(family=SDXL, objective=_SAMPLES))  # SDXL samples
    odd = replace(SD1, name="odd", uses_pooled_text_embedding=True)
    with pytest.raises(ConfigError, match="sampling odd models during training is not supported"):
        runner.attach(SimpleNamespace(family=odd, objective=_SAMPLES))
    SampleRunner(config_with(tmp_path, "")).attach(SimpleNamespace(family=odd, objective=_SAMPLES))  # off: fine


def test_attach_passes_the_prepared_modules_to_every_round(tmp_path, monkeypatch):
    (tmp_path / "p.txt").write_text("a\n", encoding="utf-8")
    keys = f'sample_prompts = "{tmp_path / "p.txt"}"\nsample_every_n_steps = 1\n'
    runner = SampleRunner(config_with(tmp_path, keys))
    seen = []
    monkeypatch.setattr(
        runner_module, "sample_images", lambda comps, prompts, **kw: seen.append(kw["prepared"])
    )
    prepared = {"unet": object(), "text_encoder_2": object()}
    runner.attach(SimpleNamespace(family=SDXL, objective=_SAMPLES), prepared)
    runner.after_step(1)
    assert seen == [prepared]


def test_zero_terminal_snr_runs_refuse_unfit_samplers_at_once(tmp_path):
    (tmp_path / "p.txt").write_text("a --ss euler\nb --ss heun\n", encoding="utf-8")
    keys = f'sample_prompts = "{tmp_path / "p.txt"}"\nv_parameterization = true\n'
    SampleRunner(config_with(tmp_path, keys))  # fine without zero_terminal_snr
    with pytest.raises(ConfigError, match='p.txt: sampler "heun" cannot use the zero_terminal'):
        SampleRunner(config_with(tmp_path, keys + "zero_terminal_snr = true\n"))
