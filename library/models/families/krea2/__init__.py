"""Krea 2 (Krea's 12.9B single-stream MMDiT, text to image), one module per concern: spec (the
facts as data), family / objective / sampling (what the trainer calls; Qwen3-VL's taps through
text_encoders/qwen3_vl.py, patch tokens through models/patch_tokens.py), keys (the original
names as a name table; LoRA files diffusers and ComfyUI apply completely), load / entry
(folders and single files through the shared loader, the registry entry), turbo."""
