"""Qwen-Image-Edit: Qwen-Image's transformer trained to change a reference image as the caption
says, its caption read by Qwen2.5-VL together with the reference (entry.py, family.py,
conditioning.py, processor.py, load.py, sampling.py; its tiny models are in
tests/kits/qwenimage_edit/)."""
