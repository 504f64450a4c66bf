"""Which of a file's tensors each converted tensor comes from, so that a shape problem found
after renaming, splitting or reordering names the tensor of the file whose header is wrong (a
fused qkv), not the intact-looking piece the converter made of it (to_q).

A converter runs on meta tensors (nothing allocated) under a torch function mode that gives
every tensor an operation returns the file keys of the tensors it was made from."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

Convert = Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]


class ConvertFailed(ValueError):
    """The converter failed on the file's shapes; ``keys``: the file tensors it was working
    on (empty when none is known)."""

    def __init__(self, message: str, keys: tuple[str, ...]):
        super().__init__(f"{', '.join(keys)}: {message}" if keys else message)
        self.keys = keys


class _Origins(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.sources: dict[int, frozenset[str]] = {}
        # every tensor given an entry stays alive while the mode is, so that its id is not reused
        self.alive: list[torch.Tensor] = []

    def add(self, tensor: torch.Tensor, keys: frozenset[str]) -> None:
        self.sources[id(tensor)] = keys
        self.alive.append(tensor)

    def of(self, values: Iterable[object]) -> frozenset[str]:
        found: frozenset[str] = frozenset()
        for value in values:
            if isinstance(value, torch.Tensor):
                found |= self.sources.get(id(value), frozenset())
        return found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        inputs = tree_flatten((args, kwargs or {}))[0]
        try:
            out = func(*args, **(kwargs or {}))
        except (RuntimeError, ValueError, IndexError) as exc:
            raise ConvertFailed(str(exc), tuple(sorted(self.of(inputs)))) from None
        keys = self.of(inputs)
        if keys:
            for value in tree_flatten(out)[0]:
                if isinstance(value, torch.Tensor) and id(value) not in self.sources:
                    self.add(value, keys)
        return out


def converted_origins(
    convert: Convert, shapes: Mapping[str, Iterable[int]]
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[str, ...]]]:
    """(the converted tensors' shapes, the file keys each was made from), by converted name,
    from the file's key -> shape. ConvertFailed naming the file tensors the failing step was
    given when the converter cannot convert these shapes."""
    meta = {k: torch.empty(tuple(s), device="meta") for k, s in shapes.items()}
    mode = _Origins()
    for key, tensor in meta.items():
        mode.add(tensor, frozenset((key,)))
    with mode:
        converted = convert(meta)
    return (
        {k: tuple(v.shape) for k, v in converted.items()},
        {k: tuple(sorted(mode.sources.get(id(v), ()))) for k, v in converted.items()},
    )


def convert_shapes(
    convert: Convert, shapes: Mapping[str, Iterable[int]]
) -> dict[str, tuple[int, ...]]:
    """Run a state-dict converter on key -> shape, without allocating any tensor; ConvertFailed
    (a ValueError) naming the file tensors it failed on."""
    return converted_origins(convert, shapes)[0]
