"""Krea 2 (Krea's 12.9B single-stream MMDiT, text to image): the whole family in one package.

One module per concern, each stating the facts it follows (from diffusers 0.42.1's
Krea2Pipeline, Krea2Transformer2DModel and their single-file and LoRA converters):

- spec: the pipeline, the text taps, the schedule and the original <-> diffusers names, as data;
- family, objective, sampling: the ModelFamily the trainer calls (Qwen3-VL's stacked taps
  through text_encoders/qwen3_vl.py, 2x2 patch tokens and grid positions through
  models/patch_tokens.py, the Qwen-Image VAE's channel-normalised latents), the rectified flow
  with musubi-tuner's draw, and Krea2Pipeline for samples (Turbo's schedule for Turbo);
- key_map: LoRA files as ``diffusion_model.<original path>`` with lora_A / lora_B and alpha
  folded in, which diffusers and ComfyUI both apply completely, read in every tool's names;
- load, files, entry: the loader (a folder through families/folder_loader.py, or the single
  files) and the registry entry; full_file: a full fine-tune in the original layout.
"""
