"""Z-Image (Tongyi-MAI's 6B single-stream DiT, Base and Turbo): the whole family in one package.

One module per concern, each stating the facts it follows (from diffusers 0.42.1's
ZImagePipeline, ZImageTransformer2DModel and single-file converter):

- shapes: the released component configs as data;
- keys: the name table between single-file (original) transformer checkpoints and diffusers;
- conditioning: captions -> the variable-length Qwen3 hidden states the model takes (the
  shared Qwen3 kind, library/models/text_encoders/);
- denoise: latents [B, C, h, w] <-> the transformer's lists of one-frame latents;
- objective: the training objective, the shared NegatedVelocityObjective (timestep 1 - sigma,
  target x0 - noise) with musubi-tuner's draw;
- targets: the Linears a default LoRA adapts (musubi-tuner's set);
- lora_keys, key_map: adapter file names (``diffusion_model.<diffusers path>``, read by ComfyUI
  and diffusers) and the other tools' layouts, which library/networks/linear_files.py reads.
- family, load, entry: the ModelFamily the trainer calls, its loader and the registry entry
  (library/models/families/registry.py lists it);
- spec, files: its folders and Comfy-Org's single files (transformer, qwen_3_4b,
  ae) as data for the shared loader, each checked tensor by tensor before a weight is read, its
  own readers beside them;
- full_file: a full fine-tune's transformer in the original names (what ComfyUI loads);
- sampling: sampling during training through ZImagePipeline.

Its tiny test models (with a tiny Qwen3-style tokenizer) and conformance kit are in
tests/kits/zimage/.
"""
