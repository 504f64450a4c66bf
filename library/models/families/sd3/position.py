"""SD3's position embeddings with kohya's two SD3.5 Medium options: random crops and tables
scaled per training resolution.

The MMDiT adds to each image patch (row i, column j of the patched latent) a fixed sin-cos
position embedding. diffusers keeps one square table (``pos_embed_max_size`` on a side) and
crops its centre to the image's patched size. kohya's SD3 trainer can change both (facts from
sd-scripts' library/sd3_models.py, written here in our own terms):

- ``pos_emb_random_crop_rate`` p: with probability p the crop is taken at a uniformly drawn
  offset instead of the centre. kohya draws once per batch; difftune draws per sample from the
  sample's keyed stream, so a sample's crop does not depend on how samples are batched. Only
  training steps crop at random; validation and sample images use the centre, as at inference.
- ``enable_scaled_pos_embed``: one table per training resolution instead of the stored one.
  For a resolution whose patched latent is S patches on a side, the table has G = int(1.5 S)
  positions on a side, at coordinates 16 (i - (G - S) / 2) / S: its central S x S crop always
  spans [0, 16) whatever S is. A batch takes the table of the smallest size whose area bound
  covers its patched area (the bound between two sizes is the mean of their squared sides; the
  largest size's is (1.5 S)^2), so multi-resolution training sees the same coordinate range at
  every resolution. An image longer than every table (a sample image larger than the training
  resolutions) gets a table of its own size. The stored table is left as it is (it is what
  files save).

Embeddings are 2-D sin-cos: the first half of the channels encodes the column coordinate, the
second half the row coordinate, each half as [sin(x w_k), cos(x w_k)] with w_k = 10000^(-k/K),
K = a quarter of the width; the same layout as the released tables.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator

import torch
from diffusers.models.embeddings import PatchEmbed

MAX_RATIO = 1.5  # a scaled table's side over its resolution's patched side
BASE_SIZE = 16  # the coordinate span of a scaled table's central crop


def sincos_1d(width: int, positions: torch.Tensor) -> torch.Tensor:
    """[len(positions), width] sin-cos embedding of positions (float64)."""
    quarter = width // 2
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    angles = positions.to(torch.float64)[:, None] * omega[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def scaled_table(width: int, side: int) -> torch.Tensor:
    """[1, G*G, width] float32 table for a resolution of ``side`` patches (G = int(1.5 side)),
    row-major over (row, column)."""
    grid = int(side * MAX_RATIO)
    coords = BASE_SIZE * (torch.arange(grid, dtype=torch.float64) - (grid - side) / 2) / side
    per_axis = sincos_1d(width // 2, coords)  # [G, width / 2]
    columns = per_axis[None, :, :].expand(grid, grid, -1)  # value of column j at (i, j)
    rows = per_axis[:, None, :].expand(grid, grid, -1)
    return torch.cat([columns, rows], dim=-1).reshape(1, grid * grid, width).float()


def patched_sides(resolutions: Iterable[tuple[int, int]], patch: int = 2) -> list[int]:
    """The patched latent sides kohya makes tables for: round(sqrt(w h)) // 8 // patch of each
    training resolution (width, height), without repeats, ascending."""
    latent = {round(math.sqrt(w * h)) // 8 for w, h in resolutions}
    return sorted({size // patch for size in latent})


def area_bounds(sides: list[int]) -> list[tuple[int, int]]:
    """(largest patched area, side) of each table, ascending: a batch of area A uses the first
    side whose bound is at least A (the last one when none is)."""
    bounds = [(sides[i - 1] ** 2 + sides[i] ** 2) // 2 for i in range(1, len(sides))]
    bounds.append(int((sides[-1] * MAX_RATIO) ** 2))
    return list(zip(bounds, sides, strict=True))


class CroppedPositions(PatchEmbed):
    """diffusers' PatchEmbed with per-sample crops and scaled tables (see the module).

    Installed on a loaded model by ``install`` (which swaps the instance's class, so the state
    dict and every parameter stay the same objects); ``crops(module, draws)`` gives one forward
    call its per-sample draws.
    """

    difftune_crop_rate: float = 0.0
    difftune_tables: dict[int, torch.Tensor] | None = None
    difftune_bounds: list[tuple[int, int]] | None = None
    difftune_draws: torch.Tensor | None = None  # [B, 3] uniforms of the current call, or None

    def cropped_pos_embed(self, height, width):
        rows, cols = height // self.patch_size, width // self.patch_size
        table, side = self._table(rows, cols)
        if rows > side or cols > side:
            raise ValueError(
                f"a {rows}x{cols}-patch image does not fit the {side}x{side} position table"
            )
        table = table.to(self.pos_embed.device).reshape(side, side, -1)
        draws = self.difftune_draws
        if draws is None or not self.difftune_crop_rate:
            return _crop(table, (side - rows) // 2, (side - cols) // 2, rows, cols)[None]
        crops = []
        for choose, top_u, left_u in draws.tolist():
            if choose < self.difftune_crop_rate:
                top = min(int(top_u * (side - rows + 1)), side - rows)
                left = min(int(left_u * (side - cols + 1)), side - cols)
            else:
                top, left = (side - rows) // 2, (side - cols) // 2
            crops.append(_crop(table, top, left, rows, cols))
        return torch.stack(crops)

    def _table(self, rows: int, cols: int) -> tuple[torch.Tensor, int]:
        if self.difftune_tables is None:
            return self.pos_embed, self.pos_embed_max_size
        side = next((s for bound, s in self.difftune_bounds if rows * cols <= bound), None)
        side = self.difftune_bounds[-1][1] if side is None else side
        table = self.difftune_tables[side]
        grid = round(math.sqrt(table.shape[1]))
        if rows > grid or cols > grid:
            # An image longer than every table (a sample image larger than the training
            # resolutions): a table of its own, as kohya adds one.
            side = max(rows, cols)
            table = scaled_table(self.pos_embed.shape[-1], side)
            self.difftune_tables[side] = table
            self.difftune_bounds = area_bounds(sorted(self.difftune_tables))
            grid = round(math.sqrt(table.shape[1]))
        return table, grid


def _crop(table: torch.Tensor, top: int, left: int, rows: int, cols: int) -> torch.Tensor:
    return table[top : top + rows, left : left + cols].reshape(rows * cols, -1)


def install(
    transformer: torch.nn.Module,
    crop_rate: float = 0.0,
    resolutions: Iterable[tuple[int, int]] | None = None,
) -> CroppedPositions:
    """Give ``transformer``'s PatchEmbed random crops at ``crop_rate`` and, with
    ``resolutions`` (the training (width, height)s), kohya's scaled tables."""
    module = transformer.pos_embed
    if not isinstance(module, PatchEmbed) or module.pos_embed_max_size is None:
        raise ValueError(f"{type(transformer).__name__} has no cropped position table")
    module.__class__ = CroppedPositions
    module.difftune_crop_rate = float(crop_rate)
    if resolutions is not None:
        sides = patched_sides(resolutions, module.patch_size)
        width = module.pos_embed.shape[-1]
        module.difftune_tables = {side: scaled_table(width, side) for side in sides}
        module.difftune_bounds = area_bounds(sides)
    return module


@contextlib.contextmanager
def crops(transformer: torch.nn.Module, draws: torch.Tensor | None) -> Iterator[None]:
    """For the calls inside: ``draws`` ([B, 3] uniforms per sample: whether to crop at random,
    the row and the column offset) on ``transformer``'s installed position embedding."""
    module = getattr(transformer, "pos_embed", None)
    if draws is None or not isinstance(module, CroppedPositions):
        yield
        return
    module.difftune_draws = draws
    try:
        yield
    finally:
        module.difftune_draws = None
