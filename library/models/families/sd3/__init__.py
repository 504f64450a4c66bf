"""SD3 and SD3.5 (Medium, 3.5 Medium, 3.5 Large): the family's package, one module per concern.

- entry: its entry in the family registry (what shared code asks before loading it);
- family: the ModelFamily (latents, conditioning, the denoiser call, LoRA files, saving);
- spec, tokenizers: its models as data for the shared loader (which models are SD3, a
  diffusers StableDiffusion3Pipeline folder, Stability AI's single file with its clip_l /
  clip_g / t5xxl files), and the T5 tokenizer, found offline;
- objective, position: kohya's SD3 rectified-flow objective and SD3.5 Medium's position-embedding
  options;
- shapes, original_keys, lora_keys: the component configs as data, the original <-> diffusers
  state-dict names, and the LoRA names (kohya's and diffusers');
- sampling: sample images during training with diffusers' StableDiffusion3Pipeline.

Its tiny test models and conformance kit are in tests/kits/sd3/.

Importing the package imports none of them.
"""
