"""--dry_run --json: the plan as one JSON document on stdout, with the documented fields, and
the same numbers as the text plan and as a count of the images on disk."""

from __future__ import annotations

import json
import math
import re

import pytest
from PIL import Image

from tests.integration.harness import reset_accelerate

# The documented fields (the "Dry-run JSON" schema); a change here is a change of the schema.
TOP_FIELDS = {
    "format",
    "version",
    "status",
    "config_files",
    "command_line",
    "model",
    "train_mode",
    "adapter",
    "datasets",
    "data_scan",
    "processes",
    "fsdp",
    "gradient_accumulation_steps",
    "effective_batch_sizes",
    "samples_per_epoch",
    "padding_per_epoch",
    "steps_per_epoch",
    "total_steps",
    "epochs",
    "warmup_steps",
    "learning_rate",
    "unet_lr",
    "text_encoder_lr",
    "lr_scheduler",
    "optimizer",
    "precision",
    "seed",
    "outputs",
    "resume",
    "memory",
}
MEMORY_FIELDS = {
    "peak_bytes",
    "weights_bytes",
    "trained_state_bytes",
    "activations_bytes",
    "optimizer_update_bytes",
    "vae_encoding_bytes",
    "process_bytes",
    "at",
    "gradient_checkpointing",
    "device_total_bytes",
    "device_free_bytes",
}
ADAPTER_FIELDS = {"name", "network_module", "rank", "alpha", "description"}
DATASET_FIELDS = {
    "resolution",
    "batch_size",
    "samples_per_step",
    "subsets",
    "train_images",
    "reg_images",
    "samples_per_epoch",
    "padding_per_epoch",
    "steps_per_epoch",
    "micro_batches_per_process",
    "validation_images",
    "skipped_images",
    "short_videos",
    "tokens_per_sample",
    "buckets",
}
SUBSET_FIELDS = {
    "image_dir",
    "is_reg",
    "images",
    "num_repeats",
    "samples_per_epoch",
    "unused_images",
    "reference_images",
    "references_from",
    "videos",
}
BUCKET_FIELDS = {
    "width",
    "height",
    "images",
    "samples_per_epoch",
    "steps_per_epoch",
    "padding_per_epoch",
    "references",
    "frames",
    "tokens",
}
OUTPUT_FIELDS = {"output_dir", "output_name", "final", "final_kind", "final_state", "saves"}
SAVE_FIELDS = {"every", "unit", "count", "keep_last", "state", "keep_last_state"}

# Images on disk: (folder, count, width, height, repeats, is_reg)
FOLDERS = [
    ("square", 3, 64, 64, 2, False),
    ("wide", 2, 96, 64, 1, False),
    ("reg", 2, 64, 64, 1, True),
]
BATCH, ACCUMULATION, EPOCHS, WARMUP, SAVE_EVERY = 2, 2, 3, 2, 4


@pytest.fixture(scope="module")
def layers(tmp_path_factory, tiny_model_dir):
    """base.toml (model, data, schedule) and run.toml (accumulation, name, a GUI-only key)."""
    root = tmp_path_factory.mktemp("json")
    subsets = []
    for name, count, width, height, repeats, is_reg in FOLDERS:
        (root / name).mkdir()
        for i in range(count):
            Image.new("RGB", (width, height), (40 * i, 90, 160)).save(root / name / f"{i}.png")
            (root / name / f"{i}.txt").write_text(f"{name} {i}", encoding="utf-8")
        subsets.append(
            f"[[datasets.subsets]]\nimage_dir = '{root / name}'\nnum_repeats = {repeats}\n"
            f"is_reg = {'true' if is_reg else 'false'}\n"
        )
    base = root / "base.toml"
    base.write_text(
        f"pretrained_model_name_or_path = '{tiny_model_dir}'\n"
        f"output_dir = '{root / 'out'}'\noutput_name = 'base'\n"
        f"learning_rate = 1e-3\nlr_scheduler = 'cosine'\nlr_warmup_steps = {WARMUP}\n"
        f"max_train_epochs = {EPOCHS}\nsave_every_n_steps = {SAVE_EVERY}\nnetwork_dim = 8\n"
        f"[[datasets]]\nbatch_size = {BATCH}\nresolution = 128\nenable_bucket = true\n"
        "min_bucket_reso = 64\nmax_bucket_reso = 256\nbucket_reso_steps = 32\n" + "".join(subsets),
        encoding="utf-8",
    )
    run = root / "run.toml"
    run.write_text(
        f"gradient_accumulation_steps = {ACCUMULATION}\noutput_name = 'run'\nepoch = 5\n",
        encoding="utf-8",
    )
    return root, base, run


def cli(capfd, *argv) -> tuple[int, str, str]:
    """Run the command line in this process; (exit code, stdout, stderr) at the fd level."""
    from library.cli import main

    capfd.readouterr()
    reset_accelerate()
    try:
        code = main([str(a) for a in argv])
    finally:
        reset_accelerate()
    out, err = capfd.readouterr()
    return code, out, err


_RUNS: dict[tuple, tuple[int, str, str]] = {}


@pytest.fixture
def runs(layers, capfd):
    """The JSON dry run and the text dry run of the same layers; each runs once per module
    (under the first test's capfd) and is kept for the others."""
    root, base, run = layers
    argv = ("--config", base, "--config", run, "--learning_rate", "2e-4", "--dry_run")
    for key in (argv + ("--json",), argv):
        if key not in _RUNS:
            _RUNS[key] = cli(capfd, *key)
    return _RUNS[argv + ("--json",)], _RUNS[argv]


def test_stdout_is_one_json_document_and_warnings_go_to_stderr(runs, layers):
    (code, out, err), _ = runs
    root, base, run = layers
    assert code == 0, err
    plan = json.loads(out)  # the whole of stdout: one document, nothing else
    assert isinstance(plan, dict)
    assert f"warning: {run}: ignored epoch" in err  # the GUI-only key: a warning, on stderr
    assert not (root / "out").exists()  # a dry run writes nothing


def test_the_documented_fields(runs, layers):
    (_, out, _), _ = runs
    root, base, run = layers
    plan = json.loads(out)
    assert set(plan) == TOP_FIELDS
    assert (plan["format"], plan["version"]) == ("difftune-plan", 1)
    assert set(plan["adapter"]) == ADAPTER_FIELDS
    assert (plan["adapter"]["name"], plan["adapter"]["rank"]) == ("LoRA", 8)
    assert set(plan["outputs"]) == OUTPUT_FIELDS
    assert [set(s) for s in plan["outputs"]["saves"]] == [SAVE_FIELDS]
    (dataset,) = plan["datasets"]
    assert set(dataset) == DATASET_FIELDS
    assert all(set(s) == SUBSET_FIELDS for s in dataset["subsets"])
    assert dataset["buckets"] and all(set(b) == BUCKET_FIELDS for b in dataset["buckets"])
    assert set(plan["precision"]) == {"mixed_precision", "trained_weights", "frozen_weights"}
    assert plan["precision"]["frozen_weights"] == "denoiser float32, text encoders float32"
    # the layers, in order, and the values they gave
    assert plan["config_files"] == [str(base), str(run)]
    assert plan["command_line"] == ["learning_rate"]
    assert plan["learning_rate"] == 2e-4 and plan["lr_scheduler"] == "cosine"
    assert plan["outputs"]["output_name"] == "run"
    assert plan["outputs"]["final"] == f"{root / 'out'}/run.safetensors"
    assert plan["resume"] is None
    assert (plan["processes"], plan["fsdp"]) == (1, "no")


def test_numbers_match_the_images_on_disk(runs):
    (_, out, _), _ = runs
    plan = json.loads(out)
    (dataset,) = plan["datasets"]
    step_size = BATCH * ACCUMULATION  # one process
    train = [f for f in FOLDERS if not f[5]]
    reg = [f for f in FOLDERS if f[5]]
    train_samples = sum(count * repeats for _, count, _, _, repeats, _ in train)
    # regularisation samples are balanced to the train samples (kohya's rule)
    samples = 2 * train_samples
    assert dataset["train_images"] == sum(f[1] for f in train)
    assert dataset["reg_images"] == sum(f[1] for f in reg)
    assert [(s["images"], s["num_repeats"], s["is_reg"]) for s in dataset["subsets"]] == [
        (count, repeats, is_reg) for _, count, _, _, repeats, is_reg in FOLDERS
    ]
    assert dataset["samples_per_epoch"] == plan["samples_per_epoch"] == samples
    assert dataset["samples_per_step"] == step_size
    assert plan["effective_batch_sizes"] == [step_size]
    assert (plan["processes"], plan["gradient_accumulation_steps"]) == (1, ACCUMULATION)
    # one bucket per shape on disk (square, wide); all reg images are square
    by_shape: dict[bool, float] = {}
    for _, count, width, height, repeats, is_reg in FOLDERS:
        per_image = train_samples / sum(f[1] for f in reg) if is_reg else repeats
        by_shape[width > height] = by_shape.get(width > height, 0) + count * per_image
    buckets = dataset["buckets"]
    assert sorted(b["width"] > b["height"] for b in buckets) == sorted(by_shape)
    for b in buckets:
        assert b["samples_per_epoch"] == by_shape[b["width"] > b["height"]]
        assert b["steps_per_epoch"] == math.ceil(b["samples_per_epoch"] / step_size)
        # an SD UNet's sequence: one position per 8 x 8 pixels (its latent grid)
        assert b["tokens"] == (b["width"] // 8) * (b["height"] // 8)
    assert dataset["tokens_per_sample"] == sorted({b["tokens"] for b in buckets})
    steps = sum(math.ceil(n / step_size) for n in by_shape.values())
    assert dataset["steps_per_epoch"] == plan["steps_per_epoch"] == steps
    assert (plan["epochs"], plan["total_steps"]) == (EPOCHS, EPOCHS * steps)
    assert plan["warmup_steps"] == WARMUP
    (save,) = plan["outputs"]["saves"]
    assert (save["every"], save["unit"], save["count"]) == (
        SAVE_EVERY,
        "steps",
        (EPOCHS * steps - 1) // SAVE_EVERY,
    )


def test_numbers_match_the_text_plan(runs, layers):
    (_, out, _), (code, text, err) = runs
    root, base, run = layers
    assert code == 0, err
    plan = json.loads(out)
    (dataset,) = plan["datasets"]

    def numbers(pattern: str) -> tuple[int, ...]:
        match = re.search(pattern, text)
        assert match, (pattern, text)
        return tuple(int(g) for g in match.groups())

    assert numbers(
        r"optimizer steps per epoch: (\d+), total optimizer steps: (\d+) \((\d+) epochs\)"
    ) == (
        plan["steps_per_epoch"],
        plan["total_steps"],
        plan["epochs"],
    )
    assert numbers(r"gradient accumulation: (\d+), effective batch per optimizer step: (\d+)") == (
        plan["gradient_accumulation_steps"],
        plan["effective_batch_sizes"][0],
    )
    assert numbers(r"(\d+) train images, (\d+) reg images, (\d+) samples per epoch") == (
        dataset["train_images"],
        dataset["reg_images"],
        dataset["samples_per_epoch"],
    )
    assert numbers(r"(\d+) warmup steps") == (plan["warmup_steps"],)
    assert numbers(r"every \d+ steps \((\d+) saves\)") == (plan["outputs"]["saves"][0]["count"],)
    rows = re.findall(
        r"(\d+)x(\d+)\s+(\d+) images\s+(\d+) samples\s+(\d+) steps #+  (\d+) tokens", text
    )
    assert [tuple(map(int, row)) for row in rows] == [
        (b["width"], b["height"], b["images"], b["samples_per_epoch"], b["steps_per_epoch"])
        + (b["tokens"],)
        for b in dataset["buckets"]
    ]
    assert "learning rate: 0.0002, cosine schedule" in text
    # the provenance line: the config files in order, then the command line
    assert f"config files (later ones win): {base}, {run}; command line: --learning_rate" in text


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--json",), "--json prints the plan of a dry run"),
        (("--dry_run", "--print_config", "--json"), "without --print_config"),
    ],
)
def test_json_without_a_dry_run_is_a_one_line_error(capfd, layers, extra, needle):
    _, base, _ = layers
    code, out, err = cli(capfd, "--config", base, *extra)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: config error in command line:")
    assert needle in err


def test_the_memory_estimate_counts_the_models_without_reading_them(runs, tiny_model_dir):
    """The dry run builds the models at their shapes only; its weights figure is what the
    loaded models with their LoRA hold (counted here by hand), its peak the sum of its parts at
    the largest bucket, and the text plan prints the same estimate."""
    import itertools

    import torch

    from library.config.schema import Config
    from library.models.loader import load_components
    from library.training.setup import setup_training

    (_, out, _), (_, text, _) = runs
    plan = json.loads(out)
    memory = plan["memory"]
    assert set(memory) == MEMORY_FIELDS
    config = Config(
        model={"pretrained_model_name_or_path": str(tiny_model_dir)},
        network={"network_dim": 8},
        datasets=[{"subsets": [{"image_dir": "unused"}]}],
    )
    comps = setup_training(config, load_components(config.model, torch.float32)).components
    modules = (comps.denoiser, comps.vae, *comps.text_encoders)
    tensors = {id(t): t for m in modules for t in itertools.chain(m.parameters(), m.buffers())}
    assert memory["weights_bytes"] == sum(t.numel() * t.element_size() for t in tensors.values())
    step = memory["trained_state_bytes"] + max(
        memory["activations_bytes"], memory["optimizer_update_bytes"]
    )
    held = memory["weights_bytes"] + max(step, memory["vae_encoding_bytes"])
    assert memory["peak_bytes"] == held + memory["process_bytes"]
    assert memory["process_bytes"] > 0  # the interpreter, at least
    assert memory["vae_encoding_bytes"] > 0  # the images are encoded in every step here
    largest = max(plan["datasets"][0]["buckets"], key=lambda b: b["width"] * b["height"])
    at = {"width": largest["width"], "height": largest["height"], "batch": BATCH, "frames": 1}
    assert memory["at"] == at
    assert f"at {at['width']}x{at['height']} x {BATCH}" in text.split("  memory: about ")[1]


def test_a_refused_dry_run_prints_json_naming_every_problem(capfd, layers):
    """A batch script that asked for JSON gets one document on a refusal too."""
    root, base, _ = layers
    bad = root / "bad.toml"
    bad.write_text("learnin_rate = 1e-4\n[training]\nnetwork_dim = 'eight'\n", encoding="utf-8")
    code, out, err = cli(capfd, "--config", base, "--config", bad, "--dry_run", "--json")
    assert code == 2 and err.startswith("error: config error in")
    document = json.loads(out)  # the whole of stdout
    assert (document["format"], document["status"], document["exit_code"]) == (
        "difftune-plan",
        "refused",
        2,
    )
    assert (document["file"], document["key"]) == (str(bad), "learnin_rate")
    assert [(p["file"], p["key"]) for p in document["problems"]] == [
        (str(bad), "learnin_rate"),
        (str(bad), "network_dim"),
    ]
    assert "did you mean" in document["problems"][0]["message"]
    assert "\n" not in document["error"] and "learnin_rate" in document["error"]
    # a refusal of the command line itself: JSON as well, with the option as the key
    code, out, _ = cli(capfd, "--config", base, "--dry_run", "--json", "--learnin_rate", "1")
    document = json.loads(out)
    assert code == 2 and document["status"] == "refused"
    assert (document["file"], document["key"]) == (None, "learnin_rate")
