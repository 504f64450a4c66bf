"""Write the committed test assets in tests/assets/ (the tiny CLIP and T5 tokenizers).

Deterministic; a test regenerates them and checks the committed files are identical. Run from
the repository root:  python tools/make_test_assets.py   (or: python -m tools.make_test_assets)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS_DIR = ROOT / "tests" / "assets"


def make_test_assets(out_dir: str | Path = ASSETS_DIR) -> list[Path]:
    """(Re)write ``out_dir``/tokenizer and ``out_dir``/t5_tokenizer; returns every generated
    file, sorted."""
    from library.models.flux.tiny import write_tiny_t5_tokenizer
    from library.models.tiny import write_tiny_tokenizer

    files = []
    for name, write in (("tokenizer", write_tiny_tokenizer), ("t5_tokenizer", write_tiny_t5_tokenizer)):
        folder = Path(out_dir) / name
        shutil.rmtree(folder, ignore_errors=True)
        write(folder)
        files += [p for p in folder.rglob("*") if p.is_file()]
    return sorted(files)


def main() -> None:
    files = make_test_assets(ASSETS_DIR)
    print(f"wrote {len(files)} files under {ASSETS_DIR}")


if __name__ == "__main__":
    # Run as a script, the repository root is not on the import path.
    sys.path.insert(0, str(ROOT))
    main()
