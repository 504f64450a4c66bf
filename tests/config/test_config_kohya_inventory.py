"""Every option of every sd-scripts training script is known: implemented, accepted with a note,
or refused by name; never an "unknown key". The same for options of newer sd-scripts releases."""

from __future__ import annotations

import pytest

from library.config import kohya, musubi_args
from library.config.kohya_script_keys import NEWER_RELEASE, OTHER_TRAININGS
from library.config.loader import load_config
from library.config.overrides import key_kind
from library.errors import ConfigError
from tests.config.kohya_arguments import KOHYA_OFF_VALUES, KOHYA_SCRIPTS, SCRIPTS

HEAD = 'pretrained_model_name_or_path = "m"\n'
DATASET = '[[datasets]]\n[[datasets.subsets]]\nimage_dir = "img"\n'

# sd-scripts' scripts of trainings difftune does not do, and the words that name them.
OTHER_SCRIPTS = {
    "lumina_train": "Lumina",
    "lumina_train_network": "Lumina",
    "anima_train": "Anima",
    "anima_train_network": "Anima",
    "hunyuan_image_train_network": "HunyuanImage",
    "train_textual_inversion": "textual-inversion",
    "train_textual_inversion_XTI": "textual-inversion",
    "sdxl_train_textual_inversion": "textual-inversion",
    "train_control_net": "ControlNet",
    "train_controlnet": "ControlNet",
    "sdxl_train_control_net": "ControlNet",
    "sdxl_train_control_net_lllite": "ControlNet",
    "sdxl_train_control_net_lllite_old": "ControlNet",
    "flux_train_control_net": "ControlNet",
}


def _not_off(off: tuple) -> object:
    """A value that is none of ``off`` (kohya's defaults), of the same kind."""
    first = off[0] if off else ""
    if isinstance(first, bool):
        return not first
    if isinstance(first, (int, float)):
        return first * 2 + 3
    return "something"


def test_inventory_covers_every_training_script():
    assert set(OTHER_SCRIPTS) < set(SCRIPTS)
    assert {"train_network", "flux_train", "sd3_train", "sdxl_train", "fine_tune", "train_db"} < set(
        SCRIPTS
    )


@pytest.mark.parametrize("key", sorted(KOHYA_OFF_VALUES))
def test_every_sd_scripts_key_is_known(key):
    # known as a schema key, a dataset default or a kohya key difftune classifies
    assert key_kind(kohya.ALIASES.get(key, key)) in ("flat", "default", "unsupported"), key


def _only_in_other_trainings() -> list[str]:
    # t5_tokenizer_path is only Anima's in sd-scripts; difftune has its own key of that name.
    # musubi-tuner's image trainers define split_attn, fp8_scaled and fp8_vl too: they are
    # classified by what they do there (tests/config/test_config_musubi_args.py)
    only = (k for k, where in KOHYA_SCRIPTS.items() if set(where) <= set(OTHER_SCRIPTS))
    return sorted(
        k for k in only if key_kind(k) != "flat" and k not in musubi_args.UNSUPPORTED
    )


def _toml(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value).replace("'", '"')


@pytest.mark.parametrize("key", _only_in_other_trainings())
def test_keys_of_other_trainings_are_refused_saying_which(write_toml, key):
    assert key in OTHER_TRAININGS, key
    value = _not_off(kohya.UNSUPPORTED[key].off)
    path = write_toml("a.toml", HEAD + f"{key} = {_toml(value)}\n" + DATASET)
    names = {OTHER_SCRIPTS[s] for s in KOHYA_SCRIPTS[key]}
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert f'"{key}" is not supported' in message
    assert any(name in message for name in names), message
    assert "unknown key" not in message


def test_newer_release_keys_are_not_in_the_pinned_inventory():
    # they come from sd-scripts releases after the commit the inventory was taken from
    assert set(NEWER_RELEASE).isdisjoint(KOHYA_OFF_VALUES)


_ON = {"show_timesteps": '"console"'}  # a value that asks for something; true for the others


@pytest.mark.parametrize("key", sorted(k for k, e in NEWER_RELEASE.items() if not e.ignored))
def test_newer_release_keys_are_refused_by_name(write_toml, key):
    entry = NEWER_RELEASE[key]
    on = _ON.get(key, "true")
    path = write_toml("on.toml", HEAD + f"{key} = {on}\n" + DATASET)
    with pytest.raises(ConfigError, match=f'"{key}" is not supported .*sd-scripts {entry.release}'):
        load_config(path)
    if entry.off == (False,):
        with pytest.raises(ConfigError, match=f'"{key}" is not supported'):
            load_config(write_toml("cli.toml", HEAD + DATASET), [(key, None)])  # bare --flag
    off = "false" if entry.off == (False,) else '""'
    assert load_config(write_toml("off.toml", HEAD + f"{key} = {off}\n" + DATASET))


@pytest.mark.parametrize("key", sorted(k for k, e in NEWER_RELEASE.items() if e.ignored))
def test_newer_release_settings_of_refused_options_load_with_a_note(write_toml, key):
    """They only act with another option (compile, show_timesteps) or on a VAE no model here
    uses: a value changes nothing, and the note says why."""
    config = load_config(write_toml("a.toml", HEAD + f"{key} = 1\n" + DATASET))
    (note,) = [n for n in config.notices if key in n]
    assert f"{key} = 1 is ignored: sd-scripts {NEWER_RELEASE[key].release} added it" in note


@pytest.mark.parametrize(
    ("line", "noted"),
    [
        # always so here: full-model saves stream (a full fine-tune's options: train_mode says so)
        ('mem_eff_save = true\ntrain_mode = "unet"', False),
        ("use_safetensors = true", False),
        ("console_log_simple = true", False),
        ('console_log_level = "DEBUG"', True),
        ("diffusers_xformers = true", True),
        # only with train_text_encoder, refused itself
        ('learning_rate_te1 = 1e-5\ntrain_mode = "unet"', True),
    ],
)
def test_options_that_change_nothing_here_load(write_toml, line, noted):
    config = load_config(write_toml("a.toml", HEAD + line + "\n" + DATASET))
    key = line.split(" =")[0]
    assert any(key in notice for notice in config.notices) == noted, config.notices


def test_options_of_the_full_fine_tune_scripts_are_refused_saying_what_works(write_toml):
    for line, instead in [
        ("train_text_encoder = true", "train a LoRA"),
        ("use_t5xxl_cache_only = true", "use cache_text_encoder_outputs"),
        ('console_log_file = "log.txt"', "tee train.log"),
    ]:
        with pytest.raises(ConfigError, match=instead):
            load_config(write_toml("a.toml", HEAD + line + "\n" + DATASET))


def test_schedule_keys_the_schedule_does_not_read_are_noted(write_toml):
    # lora-scripts writes lr_scheduler_min_lr_ratio = 0.1 and lr_scheduler_timescale = 0 for
    # every schedule; sd-scripts ignores what the schedule does not read
    keys = "lr_scheduler_min_lr_ratio = 0.1\nlr_scheduler_timescale = 0\nlr_decay_steps = 10\n"
    cosine = load_config(write_toml("a.toml", HEAD + 'lr_scheduler = "cosine"\n' + keys + DATASET))
    noted = [n for n in cosine.notices if "is not used" in n]
    assert len(noted) == 2, cosine.notices
    assert "lr_scheduler_min_lr_ratio = 0.1 is not used" in noted[0]
    assert 'lr_scheduler "warmup_stable_decay" read it, and lr_scheduler is "cosine"' in noted[1]
    wsd = 'lr_scheduler = "warmup_stable_decay"\n'
    used = load_config(write_toml("b.toml", HEAD + wsd + keys + DATASET))
    assert not [n for n in used.notices if "is not used" in n]
    assert used.optimizer.lr_scheduler_timescale is None  # 0 is unset, as lora-scripts means


def test_what_front_ends_write_into_flux_lora_configs_loads(write_toml):
    """The kohya_ss GUI writes its FLUX.1 block-index defaults ("all"), its deprecated split
    block-swap sliders and train_db's stop_text_encoder_training into LoRA exports; sd-scripts'
    LoRA scripts train as if they were not there, and so does difftune (with a note where a
    value is set)."""
    text = (
        HEAD
        + 'network_args = ["train_double_block_indices=all", "train_single_block_indices=all"]\n'
        + "double_blocks_to_swap = 6\nsingle_blocks_to_swap = 12\nstop_text_encoder_training = 5\n"
        + DATASET
    )
    config = load_config(write_toml("gui.toml", text))
    notes = " ".join(config.notices)
    for key in ("double_blocks_to_swap = 6", "single_blocks_to_swap = 12", "stop_text_encoder_training = 5"):
        assert f"{key} is ignored" in notes
    assert config.training.blocks_to_swap == 0
    # a real block selection, or GGPO, would change what trains: refused by name
    for item in ("train_double_block_indices=0-5", "ggpo_beta=0.01"):
        path = write_toml("sel.toml", HEAD + f'network_args = ["{item}"]\n' + DATASET)
        with pytest.raises(ConfigError, match=f'network_args "{item}" is not supported'):
            load_config(path)
