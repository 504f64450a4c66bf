"""FLUX.1 (dev, schnell): the family's package, one module per concern.

- entry: its entry in the family registry (what shared code asks before loading it);
- family: the ModelFamily (latents, conditioning, the denoiser call, LoRA files, saving);
- spec, load: its FluxPipeline folders and single transformer file with its clip_l / t5xxl / ae
  files as data for the shared loader (families/spec_loader.py), which models are FLUX.1, and
  the loaded parts as the trainer's components;
- shapes, original_keys, lora_keys: the component configs as data, the original <-> diffusers
  name table, and kohya's LoRA names (fused modules, from the table);
- sampling: sample images during training with diffusers' FluxPipeline.

Its tiny test models (with a tiny T5 tokenizer) and conformance kit are in tests/kits/flux/.

Importing the package imports none of them.
"""
