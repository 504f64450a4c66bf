"""Collectives for building caches across processes, apart from the training process group.

Encoding a dataset's latents can take hours on one rank while another waits; the training group's
(NCCL) timeout would kill the run. A separate gloo group with a long timeout waits instead, and
its collectives run on the CPU, so they use no GPU memory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from library.errors import DifftuneError


class CacheGroup:
    """Collectives for cache building with their own long timeout: a gloo process group created
    with torch.distributed.new_group(backend="gloo", timeout=...), so one rank's long encoding
    never trips the training process group's (NCCL) timeout and no GPU memory is used.

    Creating it is itself collective: every rank must construct it at the same point. Without an
    initialised torch.distributed it is a one-process group.
    """

    def __init__(self, timeout: timedelta = timedelta(hours=24)) -> None:
        self._group = None
        self.rank = 0
        self.world_size = 1
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo", timeout=timeout)
            self.rank = dist.get_rank()
            self.world_size = dist.get_world_size()

    @staticmethod
    def single() -> CacheGroup:
        """A no-op group for one process (never touches torch.distributed)."""
        group = CacheGroup.__new__(CacheGroup)
        group._group, group.rank, group.world_size = None, 0, 1
        return group

    def barrier(self) -> None:
        """Wait until every rank has arrived."""
        if self._group is not None:
            dist.barrier(group=self._group)

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` (picklable) on every rank; the others' `obj` is not used."""
        if self._group is None:
            return obj
        holder = [obj]
        dist.broadcast_object_list(holder, src=0, group=self._group)
        return holder[0]

    def all_gather_object(self, obj: Any) -> list:
        """Every rank's `obj` (picklable), in rank order, on every rank."""
        if self._group is None:
            return [obj]
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self._group)
        return gathered


class PeerFailed(RuntimeError):
    """Another rank failed while the caches were being built (its error is in the message)."""


def gather_or_raise(
    group: CacheGroup, payload: Any, error: BaseException | None, what: str
) -> list:
    """All ranks' `payload`s, in rank order, unless some rank passes an `error`: then every rank
    raises. It is also a barrier.

    The failing rank re-raises its own error; the others raise the same kind (DifftuneError
    subclasses keep their class, so the CLI still prints one line) naming the failed rank, rather
    than waiting at the next collective until the timeout.
    """
    report = None if error is None else _report(error)
    gathered = group.all_gather_object((report, None if error is not None else payload))
    if error is not None:
        raise error
    for rank, (report, _) in enumerate(gathered):
        if report is not None:
            raise _peer_error(rank, report, what)
    return [payload for _, payload in gathered]


def broadcast_or_raise(group: CacheGroup, make: Callable[[], Any], what: str) -> Any:
    """``make()`` run on rank 0 only, its result on every rank (the others wait meanwhile). When
    it raises, rank 0 re-raises and the others raise the same kind, as in gather_or_raise."""
    payload, report, error = None, None, None
    if group.rank == 0:
        try:
            payload = make()
        except Exception as exc:  # every rank must hear of it, or the others wait forever
            error, report = exc, _report(exc)
    report, payload = group.broadcast_object((report, payload))
    if error is not None:
        raise error
    if report is not None:
        raise _peer_error(0, report, what)
    return payload


def _report(error: BaseException) -> tuple[str, str, bool]:
    return (type(error).__name__, str(error), isinstance(error, DifftuneError))


def _peer_error(rank: int, report: tuple[str, str, bool], what: str) -> Exception:
    name, message, user_error = report
    if user_error:
        subclass = next((c for c in _difftune_errors() if c.__name__ == name), DifftuneError)
        return subclass(f"{message} (on rank {rank}, while {what})")
    return PeerFailed(f"rank {rank} failed while {what}: {name}: {message}")


def _difftune_errors() -> list[type[DifftuneError]]:
    found, todo = [], [DifftuneError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def gather_in_rounds(group: CacheGroup, items: Sequence[Any], per_round: int = 64) -> list:
    """Every rank's `items` on every rank (rank 0's first, each rank's in its order).

    They travel `per_round` per rank at a time, so the pickled buffers of one collective stay
    small even when the items (e.g. latents) total gigabytes.
    """
    if group.world_size == 1:
        return list(items)
    counts = group.all_gather_object(len(items))
    rounds = -(-max(counts) // per_round)
    received: list[list] = [[] for _ in counts]
    for r in range(rounds):
        chunk = list(items[r * per_round : (r + 1) * per_round])
        for rank, part in enumerate(group.all_gather_object(chunk)):
            received[rank].extend(part)
    return [item for part in received for item in part]
