"""Sorting an image folder's listing into images, caption files and other entries, with the
stats the scan index compares: in this process, or for a large folder in parts, one part here
and the others in worker processes, so that the stats (a system call per file) use every core.

Decisions:
- Standard library only, and runnable as a script: a worker is ``python -I -S listing.py``, a
  fresh interpreter that imports nothing of the trainer (no torch, no CUDA, no threads of the
  parent), so starting one is safe in any process and costs a few dozen milliseconds. It reads
  its part of the names from stdin and writes the sorted part to stdout (marshal).
- Below PARALLEL_ENTRIES entries, or where entries cannot be stat'ed by name in the open folder
  (Windows), no process is started: small datasets and the tests pay nothing.
- The parts are the folder's names from one listing, so every name is sorted exactly once. Each
  part sorts its names first, so its images and captions come out in name order (the sort of a
  million names shared by the processes); the parts' images and captions are then merged in
  name order here (a merge of sorted runs: a fraction of a sort), the other names concatenated.
  In name order a rerun's listing equals the scan index's names (written in that order), which
  it then compares without a lookup per name.
- A worker that fails (cannot start, dies, writes something else) costs time, not results: its
  part is sorted again in this process, where any error is the one a serial scan raises.
"""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
import threading
from array import array
from functools import partial
from stat import S_ISDIR

# A folder with at least this many entries is sorted in parts (a million images and their
# captions: two million stats). Below it a process start costs more than it saves.
PARALLEL_ENTRIES = 40_000
# What a listing keeps of each file's stat, five numbers (stat_fields): st_mode, then the
# identity the scan index compares (library.data.scan_index). NO_STAT: a file without a stat (a
# broken link); no file has the mode 0.
NO_STAT = (0, 0, 0, 0, 0)
_LOW_BITS = (1 << 63) - 1  # the times and inode as their low 63 bits: signed 64-bit numbers


class Rules:
    """Which names are what: the image suffixes, the caption suffix (lower case), the sidecar
    suffixes and system file names (lower case)."""

    def __init__(self, images, caption: str, sidecars, system) -> None:
        self.images, self.caption = frozenset(images), caption
        self.sidecars, self.system = frozenset(sidecars), frozenset(system)

    def as_tuple(self) -> tuple:
        return (tuple(self.images), self.caption, tuple(self.sidecars), tuple(self.system))


class Sorted:
    """One listing (or part of it) sorted: image and caption names in name order with their stat
    fields (five numbers per file: st_mode, size, mtime_ns, ctime_ns, inode), every name that is
    not an image, and the names to report as ignored (not hidden, system, caption or sidecar
    files)."""

    def __init__(self) -> None:
        self.images: list[str] = []
        self.image_stats = array("q")
        self.captions: list[str] = []
        self.caption_stats = array("q")
        self.others: list[str] = []
        self.reported: list[str] = []

    def as_tuple(self) -> tuple:
        return (self.images, self.image_stats.tobytes(), self.captions,
                self.caption_stats.tobytes(), self.others, self.reported)  # fmt: skip

    @classmethod
    def of_tuple(cls, values: tuple) -> Sorted:
        part = cls()
        images, image_stats, captions, caption_stats, others, reported = values
        part.images, part.captions, part.others, part.reported = images, captions, others, reported
        part.image_stats.frombytes(image_stats)
        part.caption_stats.frombytes(caption_stats)
        if len(part.image_stats) != 5 * len(images) or len(part.caption_stats) != 5 * len(captions):
            raise ValueError("stats differ in length from the names")
        return part

    @classmethod
    def merged(cls, parts: list[Sorted]) -> Sorted:
        """The parts as one listing, images and captions in name order."""
        if len(parts) == 1:
            return parts[0]
        whole = cls()
        whole.images, whole.image_stats = _merged([(p.images, p.image_stats) for p in parts])
        whole.captions, whole.caption_stats = _merged(
            [(p.captions, p.caption_stats) for p in parts]
        )
        for part in parts:
            whole.others += part.others
            whole.reported += part.reported
        return whole


def _merged(runs: list[tuple[list[str], array]]) -> tuple[list[str], array]:
    """Names in name order with their stat fields, from runs each in name order. Timsort finds
    the runs and merges them (about a comparison per name)."""
    names = [name for run, _ in runs for name in run]
    stats = array("q")
    for _, fields in runs:
        stats += fields
    order = sorted(range(len(names)), key=names.__getitem__)
    # numpy (only the scanning process merges; a worker imports nothing but the standard
    # library) gathers a million files' stats in a fraction of what slicing them here takes
    import numpy as np

    rows = np.frombuffer(stats, np.int64).reshape(-1, 5)
    merged = array("q")
    merged.frombytes(rows[np.fromiter(order, np.intp, len(order))].tobytes())
    return [names[i] for i in order], merged


def stat_fields(info: os.stat_result) -> tuple[int, int, int, int, int]:
    """(st_mode, size, mtime_ns, ctime_ns, inode) of a stat result (written out: it is called
    for millions of files)."""
    return (
        info.st_mode,
        info.st_size,
        info.st_mtime_ns & _LOW_BITS,
        info.st_ctime_ns & _LOW_BITS,
        info.st_ino & _LOW_BITS,
    )


def _stats(names: list[str], stat) -> array:
    """The stat_fields of each of ``names`` (NO_STAT where it has none), written out: two
    million files pass here."""
    stats = array("q")
    extend = stats.extend
    for name in names:
        try:
            info = stat(name)
        except OSError:
            extend(NO_STAT)
            continue
        extend((info.st_mode, info.st_size, info.st_mtime_ns & _LOW_BITS,
                info.st_ctime_ns & _LOW_BITS, info.st_ino & _LOW_BITS))  # fmt: skip
    return stats


def sort_names(names, stat, is_dir, rules: Rules) -> Sorted:
    """``names`` sorted by ``rules`` (images and captions in name order); ``stat(name)`` stats a
    file (following links), ``is_dir(name)`` says whether an entry is a folder (asked only of
    sidecar-named entries)."""
    names = sorted(names)
    part = Sorted()
    images, captions, others, reported = part.images, part.captions, part.others, part.reported
    image_suffixes, caption_suffix, system = rules.images, rules.caption, rules.system
    # a million names pass here: the suffix is found once per name, the caption files' (the
    # usual other entry) checked first
    for name in names:
        dot = name.rfind(".")
        suffix = name[dot:].lower() if 0 < dot < len(name) - 1 else ""
        if suffix in image_suffixes:
            if not name.startswith("."):
                images.append(name)
                continue
        elif suffix == caption_suffix and name.lower() not in system:
            others.append(name)
            captions.append(name)
            continue
        others.append(name)
        if name.startswith(".") or name.lower() in system:
            continue
        sidecar = suffix in rules.sidecars or suffix == caption_suffix
        if sidecar and not is_dir(name):  # a folder "a.txt" is reported, not a caption
            continue
        reported.append(name)
    part.image_stats, part.caption_stats = _stats(images, stat), _stats(captions, stat)
    return part


def in_folder(descriptor: int):
    """(stat, is_dir) of names in the folder open as ``descriptor`` (links followed)."""

    stat = partial(os.stat, dir_fd=descriptor)  # a call per file: no Python frame

    def is_dir(name: str) -> bool:
        try:
            return S_ISDIR(os.stat(name, dir_fd=descriptor).st_mode)
        except OSError:
            return False

    return stat, is_dir


def _workers(count: int) -> int:
    """How many parts a listing of ``count`` entries is sorted in (1: no worker)."""
    if count < PARALLEL_ENTRIES or os.stat not in os.supports_dir_fd:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, 8, count // (PARALLEL_ENTRIES // 2)))


def start_worker(command: list[str], payload: object) -> subprocess.Popen | None:
    """A worker process running ``command``, ``payload`` written to its stdin (marshal) by a
    thread, so that this process goes on with its own part while the worker starts (a payload
    larger than the pipe holds would otherwise wait for the worker's imports); None when it
    cannot start."""
    try:
        worker = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
    except OSError:
        return None
    writer = threading.Thread(target=_send, args=(worker, marshal.dumps(payload)), daemon=True)
    writer.start()
    _WRITERS[worker] = writer
    return worker


# The thread writing each running worker's payload (start_worker), joined by finish_worker.
_WRITERS: dict[subprocess.Popen, threading.Thread] = {}


def _send(worker: subprocess.Popen, data: bytes) -> None:
    try:
        worker.stdin.write(data)
        worker.stdin.close()
    except OSError:  # it died: finish_worker sees it fail, and its part is done here
        worker.kill()


def finish_worker(worker: subprocess.Popen | None) -> object | None:
    """What ``worker`` (None: it did not start) wrote to its stdout (marshal); None when it
    failed or wrote something else."""
    if worker is None:
        return None
    output = worker.stdout.read()
    worker.stdout.close()
    code = worker.wait()
    _WRITERS.pop(worker).join()
    if code != 0:
        return None
    try:
        return marshal.loads(output)
    except (ValueError, TypeError, EOFError):
        return None


def _start(folder: str, names: list[str], rules: Rules) -> subprocess.Popen | None:
    command = [sys.executable, "-I", "-S", __file__]
    return start_worker(command, (folder, names, rules.as_tuple()))


def _finish(worker: subprocess.Popen | None) -> Sorted | None:
    values = finish_worker(worker)
    try:
        return None if values is None else Sorted.of_tuple(values)
    except (ValueError, TypeError):
        return None


def sort_folder(folder: str, descriptor: int, rules: Rules) -> Sorted:
    """The entries of ``folder``, open as ``descriptor``, sorted: a large folder in parts, one
    here and the others in worker processes."""
    names = os.listdir(descriptor)
    stat, is_dir = in_folder(descriptor)
    parts = _workers(len(names))
    shares = [names[i::parts] for i in range(parts)] if parts > 1 else [names]
    workers = [(share, _start(folder, share, rules)) for share in shares[1:]]
    result = [sort_names(shares[0], stat, is_dir, rules)]
    for share, worker in workers:
        part = _finish(worker)
        result.append(part if part is not None else sort_names(share, stat, is_dir, rules))
    return Sorted.merged(result)


def _main() -> None:
    folder, names, rules = marshal.loads(sys.stdin.buffer.read())
    descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    stat, is_dir = in_folder(descriptor)
    part = sort_names(names, stat, is_dir, Rules(*rules))
    sys.stdout.buffer.write(marshal.dumps(part.as_tuple()))


if __name__ == "__main__":
    _main()
