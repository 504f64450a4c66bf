"""Stable Diffusion 1.x, 2.x and SDXL: the family's package, one module per concern.

- entry: its entry in the family registry (what shared code asks before loading it; SD takes
  every model no other family claims);
- family: the ModelFamily of each variant (SD 1.x, SD 2.x 512 / 768-v, SDXL, v-prediction);
- load, single_file, checkpoint_layout: diffusers folders, single-file (original Stability
  layout) checkpoints, and what such a file holds (prefixes, text towers), shared with the
  exporter (library/saving/checkpoint_export.py);
- blocks: kohya's block-wise network_args rules over the SD and SDXL UNets' blocks.

The UNet/VAE/CLIP name tables and component configs of the original layout
(library/models/original_names.py, checkpoint_parts.py, configs/) stay shared: other families'
loaders use them too. Its tiny test models (with the tiny CLIP tokenizer every family's tiny
models use) and conformance kit are in tests/kits/sd/.

Importing the package imports none of them.
"""
