"""Startup against dataset size: how long difftune takes from the command to the plan (and, with
``--first_step``, to the first optimizer step) on generated datasets of tiny images, in a first
run and in a rerun that finds the scan index; the scan alone, its memory per image and the
index's bytes per image.

    python bench/data_scan.py                              # 1k and 10k images
    python bench/data_scan.py --sizes 1000 10000 100000 1000000
    python bench/data_scan.py --sizes 1000 40000 --sd_scripts ~/sd-scripts
    python bench/data_scan.py --sizes 100000 --against main   # rerun scan: main's code vs this
    python bench/data_scan.py --sizes 100000 --against main --first_run --drop_pages

Not a test and not timed in CI. A dataset of N images is one kohya DreamBooth folder
(``1_bench``) of N 8x8 PNGs, each with a one-line .txt caption, written once per size under
``--data`` (about 0.2 KB per image; a million images take some 9 GB of inodes and blocks, so
check the disk). Tiny images make the figures the cost per file (listing, stat, header, caption),
not the cost of decoding big pictures, which the scan never does.

Figures per size and run ("first": no scan index; "rerun": the index the first run wrote):
- plan_seconds: ``train_network.py --dry_run`` from the command to its exit (by default the
  tiny SD 1.5 test model, so the imports and the scan dominate), and plan_cpu_seconds, the CPU
  time it took (resource.getrusage: all its threads);
- scan_seconds, scan_images_per_second: the scan alone (TrainData, in a fresh process), and
  scan_cpu_seconds, the CPU time it took (all its threads): on a busy machine the wall clock
  also counts the time other programs had the cores;
- scan_bytes_per_image: the Python heap the scanned dataset holds, per image (tracemalloc);
- index_bytes_per_image: the scan index file's size per image;
- with ``--first_step``: first_step_seconds, the command to the end of the first optimizer step
  of a one-step training (bench/train_speed.py's step timer), and first_step_cpu_seconds, the
  trainer's CPU time at that step; with ``--sd_scripts`` the same for kohya's train_network.py
  on the same folder and model (first run only: it keeps no index), and difftune's figures over
  kohya's (wall clock and CPU). sd-scripts builds its UNet at SD 1.5's released shapes, so
  it cannot load the tiny model: with ``--sd_scripts`` the model is a full-size SD 1.5 (random
  weights, bench/random_models.py, about 2 GB written once) and ``--first_step`` is implied.

Human-readable lines go to stderr, one JSON object per size and run to stdout.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.train_speed import (  # noqa: E402
    COMMON_KEYS,
    BenchError,
    case_text,
    describe_machine,
    kohya_tokenizer_dir,
    launch,
    log,
)

DEFAULT_SIZES = (1_000, 10_000)
MODELS = ("tiny-sd1", "sd15")  # sd-scripts loads only the second

# Measured in a fresh process, so one size's memory and imports do not colour the next.
_SCAN = r"""
import json, resource, sys, time, tracemalloc
sys.path.insert(0, sys.argv[1])
from library.config.dataset_schema import DatasetConfig, SubsetConfig
from library.data.dataset import TrainData
folder, cache, memory = sys.argv[2], sys.argv[3], sys.argv[4] == "memory"
config = DatasetConfig(batch_size=1, resolution=64, enable_bucket=True,
                       min_bucket_reso=64, max_bucket_reso=128,
                       subsets=[SubsetConfig(image_dir=folder, num_repeats=1)])
if memory:  # tracemalloc slows every allocation: not in the timed pass
    tracemalloc.start()
def cpu_time():  # this process's threads and the worker processes it waited for
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime
started, cpu = time.perf_counter(), cpu_time()
data = TrainData([config], seed=0, cache_dir=cache)
seconds, cpu = time.perf_counter() - started, cpu_time() - cpu
held = tracemalloc.get_traced_memory()[0]
scanned = data.scanned[0]
print(json.dumps({"scan_seconds": seconds, "scan_cpu_seconds": cpu, "images": len(scanned.images),
                  "from_index": scanned.indexed, "held_bytes": held}))
"""


def dataset(count: int, root: Path) -> Path:
    """The train_data_dir of ``count`` 8x8 PNGs with captions, written once."""
    import io

    from PIL import Image

    folder = root / f"images-{count}"
    if (folder / "1_bench").is_dir():
        return folder
    tmp = root / f".images-{count}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    images = tmp / "1_bench"
    images.mkdir(parents=True)
    pixels = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 120, 40)).save(pixels, "PNG")
    data = pixels.getvalue()
    log(f"writing {count} images to {folder} (once)")
    for i in range(count):
        (images / f"{i:07d}.png").write_bytes(data)
        (images / f"{i:07d}.txt").write_text(f"bench image {i}, orange, square", "utf-8")
    tmp.replace(folder)
    return folder


def write_config(folder: Path, model: Path, cache: Path, work: Path, kohya: Path | None) -> Path:
    """A flat args file both trainers read: one optimizer step, 64 px buckets, the scan index
    (and any disk cache) in ``cache``."""
    keys = {
        "pretrained_model_name_or_path": str(model),
        "train_data_dir": str(folder),
        "resolution": "64,64",
        "enable_bucket": True,
        "min_bucket_reso": 64,
        "max_bucket_reso": 128,
        "max_train_steps": 1,
        "network_module": "networks.lora",
        "network_dim": 4,
        "network_alpha": 4,
        **COMMON_KEYS,
    }
    keys["cache_dir"] = str(cache)
    if kohya is not None:
        keys["tokenizer_cache_dir"] = str(kohya)
    path = work / "config.toml"
    path.write_text(case_text(keys), "utf-8")
    return path


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def plan_seconds(config: Path, work: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of the dry run, the CPU time that of the process and its threads."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, str(REPO / "train_network.py"), "--config_file", str(config),
               "--output_dir", str(work / "plan-output"), "--dry_run"]  # fmt: skip
    started, cpu = time.perf_counter(), _children_cpu()
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - started, _children_cpu() - cpu
    if result.returncode != 0:
        raise BenchError(f"the dry run failed:\n{result.stderr.strip()[-2000:]}")
    return seconds, cpu


def _scan(folder: Path, cache: Path, memory: bool, code: Path = REPO) -> dict:
    command = [sys.executable, "-c", _SCAN, str(code), str(folder / "1_bench"), str(cache),
               "memory" if memory else "time"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise BenchError(f"the scan failed:\n{result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def scan_figures(folder: Path, cache: Path) -> dict:
    """The scan timed, then (another process, the index now written) its memory measured."""
    figures = _scan(folder, cache, memory=False)
    figures["held_bytes"] = _scan(folder, cache, memory=True)["held_bytes"]
    images = figures["images"]
    index = sum(f.stat().st_size for f in (cache / "scan").glob("*.json"))
    return {
        "scan_seconds": round(figures["scan_seconds"], 2),
        "scan_cpu_seconds": round(figures["scan_cpu_seconds"], 2),
        "scan_images_per_second": round(images / figures["scan_seconds"]),
        "from_index": figures["from_index"],
        "scan_bytes_per_image": round(figures["held_bytes"] / images),
        "index_bytes_per_image": round(index / images),
    }


def export(ref: str, work: Path) -> Path:
    """This repository's library at the git commit ``ref``, written under ``work``."""
    result = subprocess.run(["git", "-C", str(REPO), "archive", ref, "library"],
                            capture_output=True)  # fmt: skip
    if result.returncode != 0:
        raise BenchError(f"--against {ref}: {result.stderr.decode().strip()}")
    tree = work / f"code-{ref}"
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as archive:
        archive.extractall(tree, filter="data")
    return tree


def drop_pages(folder: Path) -> None:
    """Drop the data pages of the folder's files from the page cache (posix_fadvise DONTNEED:
    no root needed; the kernel keeps their inodes and directory entries), so that a scan reads
    every image and caption file from the disk."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        for name in os.listdir(descriptor):
            file = os.open(name, os.O_RDONLY, dir_fd=descriptor)
            try:
                os.posix_fadvise(file, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(file)
    finally:
        os.close(descriptor)


def scan_against(count: int, folder: Path, args: argparse.Namespace, work: Path) -> None:
    """The rerun scan (with ``--first_run`` the first scan, no index) of ``args.against``'s code
    and of this checkout's, alternated ``args.rounds`` times in one run (each over its own
    index, written by a first scan), so both meet the same load; with ``--drop_pages`` the
    files' data pages are dropped from the page cache before each scan."""
    codes = {args.against: args.against_code, "this checkout": REPO}
    caches = {name: work / f"against-{count}-{i}" for i, name in enumerate(codes)}
    for name, code in codes.items():
        shutil.rmtree(caches[name], ignore_errors=True)
        if not args.first_run:
            _scan(folder, caches[name], False, code)
    figures: dict[str, list[dict]] = {name: [] for name in codes}
    for _ in range(args.rounds):
        for name, code in codes.items():
            if args.first_run:
                shutil.rmtree(caches[name], ignore_errors=True)
            if args.drop_pages:
                drop_pages(folder / "1_bench")
            figures[name].append(_scan(folder, caches[name], False, code) | {
                "load": os.getloadavg()[0]})  # fmt: skip
    for name, runs in figures.items():
        cpu = sorted(run["scan_cpu_seconds"] for run in runs)
        wall = sorted(run["scan_seconds"] for run in runs)
        emit({"images": count, "run": "first" if args.first_run else "rerun",
              "trainer": f"difftune ({name})",
              "scan_cpu_seconds_median": round(cpu[len(cpu) // 2], 2),
              "scan_cpu_seconds_min": round(cpu[0], 2),
              "scan_seconds_median": round(wall[len(wall) // 2], 2),
              "scan_seconds": [round(run["scan_seconds"], 2) for run in runs],
              "scan_cpu_seconds": [round(run["scan_cpu_seconds"], 2) for run in runs],
              "load_average": [round(run["load"], 1) for run in runs],
              "from_index": runs[-1]["from_index"]})  # fmt: skip


def warm(model: Path) -> None:
    """Read the model's files once, so that the first run timed does not alone pay for reading
    them from disk (the full-size model is 2 GB) while the runs after it find them in memory."""
    for path in model.rglob("*"):
        if path.is_file():
            with path.open("rb") as file:
                while file.read(1 << 24):
                    pass


def first_step_seconds(
    script: Path, config: Path, work: Path, cwd: Path, python: str
) -> tuple[float, float]:
    """(wall, CPU) seconds from the command to the end of the first optimizer step; the CPU
    time is the trainer process's (all its threads) at that step."""
    shutil.rmtree(work, ignore_errors=True)
    run = launch(script, config, work, 1, "cpu", cwd, python, 1, [])
    return round(run.step_times[0] - run.started, 2), round(run.steps[0]["cpu_seconds"], 2)


def bench_size(count: int, args: argparse.Namespace, model: Path, kohya: Path | None, work: Path):
    folder = dataset(count, args.data)
    if args.against:
        scan_against(count, folder, args, work)
        return
    cache = work / f"cache-{count}"
    config = write_config(folder, model, cache, work, kohya)
    warm(model)
    for run in ("first", "rerun"):

        def fresh(run: str = run) -> None:  # a first run measures each figure without an index
            if run == "first":
                shutil.rmtree(cache, ignore_errors=True)

        record = {"images": count, "run": run, "trainer": "difftune"}
        fresh()
        record |= scan_figures(folder, cache)
        fresh()
        wall, cpu = plan_seconds(config, work)
        record["plan_seconds"], record["plan_cpu_seconds"] = round(wall, 2), round(cpu, 2)
        if args.first_step:
            fresh()
            out = work / f"difftune-{count}-{run}"
            record["first_step_seconds"], record["first_step_cpu_seconds"] = first_step_seconds(
                REPO / "train_network.py", config, out, REPO, sys.executable
            )
        emit(record)
        if run == "first":
            ours = record.get("first_step_seconds"), record.get("first_step_cpu_seconds")
    if args.sd_scripts:
        out = work / f"sd-scripts-{count}"
        seconds, cpu = first_step_seconds(args.sd_scripts / "train_network.py", config, out,
                                          args.sd_scripts, args.sd_scripts_python or sys.executable)  # fmt: skip
        emit({"images": count, "run": "first", "trainer": "sd-scripts",
              "first_step_seconds": seconds, "first_step_cpu_seconds": cpu,
              "difftune_over_sd_scripts": round(ours[0] / seconds, 2),
              "difftune_over_sd_scripts_cpu": round(ours[1] / cpu, 2)})  # fmt: skip


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)
    figures = ", ".join(
        f"{k} {v}" for k, v in record.items() if k not in ("images", "run", "trainer")
    )
    log(f"{record['trainer']} {record['images']} images, {record['run']} run: {figures}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES),
                        help="dataset sizes in images (default: 1000 10000)")  # fmt: skip
    parser.add_argument("--data", type=Path,
                        default=Path(tempfile.gettempdir()) / "difftune-data-scan",
                        help="where the generated datasets are written once (kept)")  # fmt: skip
    parser.add_argument("--model_cache", type=Path,
                        default=Path.home() / ".cache" / "difftune-bench",
                        help="where the model is written once")  # fmt: skip
    parser.add_argument("--first_step", action="store_true",
                        help="also time a one-step training to its first optimizer step")  # fmt: skip
    parser.add_argument("--model", choices=MODELS,
                        help="tiny-sd1 (default) or a full-size sd15 (the default with --sd_scripts)")  # fmt: skip
    parser.add_argument("--sd_scripts", type=Path,
                        help="a kohya-ss sd-scripts checkout: time its train_network.py too")  # fmt: skip
    parser.add_argument("--sd_scripts_python",
                        help="the Python of sd-scripts' environment (default: this one)")  # fmt: skip
    parser.add_argument("--against", metavar="GIT_REF",
                        help="only time the rerun scan, of this commit's code and of this "
                             "checkout's, alternated in one run")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3,
                        help="with --against: scans of each (default 3)")  # fmt: skip
    parser.add_argument("--first_run", action="store_true",
                        help="with --against: time the first scan (no index), not the rerun")  # fmt: skip
    parser.add_argument("--drop_pages", action="store_true",
                        help="with --against: drop the files' data pages from the page cache "
                             "before each scan (their inodes stay cached)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.sd_scripts and not (args.sd_scripts / "train_network.py").is_file():
        parser.error(f"--sd_scripts {args.sd_scripts}: no train_network.py there")
    if args.sd_scripts and args.model == "tiny-sd1":
        parser.error("--sd_scripts needs --model sd15: sd-scripts cannot load the tiny model")
    if (args.first_run or args.drop_pages) and not args.against:
        parser.error("--first_run and --drop_pages go with --against GIT_REF")
    args.model = args.model or ("sd15" if args.sd_scripts else "tiny-sd1")
    args.first_step = args.first_step or bool(args.sd_scripts)  # the figure compared
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from bench.random_models import model_folder

    log(f"machine: {describe_machine('cpu')}")
    model = model_folder(args.model, args.model_cache, log=log)
    kohya = kohya_tokenizer_dir(model, args.model_cache) if args.sd_scripts else None
    work = Path(tempfile.mkdtemp(prefix="difftune-data-scan-"))
    try:
        args.against_code = export(args.against, work) if args.against else None
        for count in args.sizes:
            bench_size(count, args, model, kohya, work)
    except BenchError as error:
        log(f"error: {error}")
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
