"""Chroma (lodestones' 8.9B text-to-image transformer derived from FLUX.1 schnell): the whole
family in one package (diffusers 0.42.1's ChromaPipeline and ChromaTransformer2DModel).

- spec, original_keys, shapes: its folders and single files as data for the shared loader
  (families/spec_loader.py), its name table, its released configs;
- entry: the registry entry (its claims are spec.py's, its loader family.py's);
- family, conditioning, checkpointing, sampling: the ModelFamily the trainer calls (kohya's
  module names derived from the name table), captions -> T5 states and padding masks, the
  masked single blocks, sampling through ChromaPipeline.

Its tiny test models and conformance kit are in tests/kits/chroma/.
"""
