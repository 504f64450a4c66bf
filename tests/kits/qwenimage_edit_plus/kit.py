"""Qwen-Image-Edit-2509's kit for the family conformance suite: Qwen-Image-Edit's on a
QwenImageEditPlusPipeline folder (tests/kits/qwenimage_edit/kit.py builds both)."""

from tests.kits.qwenimage_edit.kit import PLUS_KIT as KIT

__all__ = ["KIT"]
