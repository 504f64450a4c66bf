"""Qwen-Image (Alibaba Qwen's 20B MMDiT, text to image): the whole family in one package.

One module per concern, each stating the facts it follows (from diffusers 0.42.1's
QwenImagePipeline, QwenImageTransformer2DModel and AutoencoderKLQwenImage):

- shapes: the released component configs as data;
- conditioning: captions -> the prompt template, Qwen2.5-VL's last hidden states without the
  template's first 34 tokens, at each caption's own length;
- denoise: one-frame latents [B, 16, 1, h, w] <-> the transformer's 2x2-patch tokens,
  img_shapes, the caption mask;
- objective: the rectified flow in Qwen-Image's conventions (sigma in, noise - x0 out) with
  musubi-tuner's draw;
- targets, key_map: the Linears a default LoRA adapts (musubi-tuner's set) and their file
  names (``diffusion_model.<diffusers path>``, read by ComfyUI and diffusers);
- spec: its folders and the single files ComfyUI users have (transformer, Qwen2.5-VL, the VAE
  in Wan 2.1's names, the last two read by the shared readers of those parts) as a family spec
  for the shared loader (spec_loader.py);
- family, load, entry: the ModelFamily the trainer calls, the loader and the registry entry
  (registry.py lists it);
- config_keys: [flow] model_version, which release a transformer file is;
- sampling: sampling during training through QwenImagePipeline.

Its tiny test models and conformance kit are in tests/kits/qwenimage/.
"""
