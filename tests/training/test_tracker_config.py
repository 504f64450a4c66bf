"""log_config: the tracker gets the resolved config (no secrets) as hyper-parameters, or, with
kohya's log_config = false, none."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from library.config.loader import load_config
from library.training.progress import ProgressReporter

HEAD = 'pretrained_model_name_or_path = "m"\nlog_with = "tensorboard"\nwandb_api_key = "k"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'


class _Accelerator:
    is_main_process = True

    def __init__(self, folder):
        self.logging_dir = str(folder)
        self.trackers = []

    def init_trackers(self, name, config=None, init_kwargs=None):
        self.trackers.append((name, config))


@pytest.mark.parametrize("line, logged", [("", True), ("log_config = true\n", True),
                                          ("log_config = false\n", False)])
def test_the_config_goes_to_the_tracker_unless_log_config_is_false(tmp_path, line, logged):
    path = tmp_path / "a.toml"
    path.write_text(HEAD + line + "learning_rate = 0.002\n" + DATASET, encoding="utf-8")
    config = load_config(path)
    accelerator = _Accelerator(tmp_path / "run")
    plan = SimpleNamespace(total_steps=3)
    ProgressReporter(config, accelerator, plan, 0, ["unet"]).bar.close()
    ((_, sent),) = accelerator.trackers
    if not logged:
        assert sent is None
        return
    assert sent["optimizer/learning_rate"] == 0.002
    assert "logging/wandb_api_key" not in sent and "k" not in sent.values()
