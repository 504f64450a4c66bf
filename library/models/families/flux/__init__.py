"""FLUX.1 (dev, schnell): the family's package, one module per concern.

- entry: its entry in the family registry (what shared code asks before loading it);
- family: the ModelFamily (latents, conditioning, the denoiser call, LoRA files, saving);
- load, files, tokenizers: which models are FLUX.1, a diffusers FluxPipeline folder, the single
  transformer file with its clip_l / t5xxl / ae files, and the tokenizers, found offline;
- shapes, original_keys, lora_keys: the component configs as data, the original <-> diffusers
  state-dict names, and kohya's LoRA names (fused modules);
- sampling: sample images during training with diffusers' FluxPipeline.

Its tiny test models (with a tiny T5 tokenizer) and conformance kit are in tests/kits/flux/.

Importing the package imports none of them.
"""
