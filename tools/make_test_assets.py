"""Write the committed test assets in tests/assets/ (the tiny CLIP, T5, Qwen3 and Qwen2.5-VL
tokenizers).

Deterministic; tests regenerate them and check the committed files are identical. Run from
the repository root:  python tools/make_test_assets.py   (or: python -m tools.make_test_assets)
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS_DIR = ROOT / "tests" / "assets"


def asset_writers() -> dict[str, Callable[[Path], object]]:
    """Folder name under tests/assets/ -> the function writing it."""
    from tests.kits.flux.tiny import write_tiny_t5_tokenizer
    from tests.kits.qwenimage.tiny_tokenizer import write_tiny_qwen25vl_tokenizer
    from tests.kits.sd.tiny import write_tiny_tokenizer
    from tests.kits.zimage.tiny_tokenizer import write_tiny_qwen3_tokenizer

    return {
        "tokenizer": write_tiny_tokenizer,
        "t5_tokenizer": write_tiny_t5_tokenizer,
        "qwen3_tokenizer": write_tiny_qwen3_tokenizer,  # Z-Image's text encoder's tokenizer
        "qwen25vl_tokenizer": write_tiny_qwen25vl_tokenizer,  # Qwen-Image's (Qwen2.5-VL's)
    }


def make_test_assets(
    out_dir: str | Path = ASSETS_DIR, names: Sequence[str] | None = None
) -> list[Path]:
    """(Re)write the folders ``names`` (unset: every one) under ``out_dir``; returns every
    generated file, sorted."""
    writers = asset_writers()
    files = []
    for name in writers if names is None else names:
        folder = Path(out_dir) / name
        shutil.rmtree(folder, ignore_errors=True)
        writers[name](folder)
        files += [p for p in folder.rglob("*") if p.is_file()]
    return sorted(files)


def main() -> None:
    files = make_test_assets(ASSETS_DIR)
    print(f"wrote {len(files)} files under {ASSETS_DIR}")


if __name__ == "__main__":
    # Run as a script, the repository root is not on the import path.
    sys.path.insert(0, str(ROOT))
    main()
