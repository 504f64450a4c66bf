"""Chroma (lodestones' 8.9B text-to-image transformer derived from FLUX.1 schnell): the whole
family in one package.

One module per concern, each stating the facts it follows (diffusers 0.42.1's ChromaPipeline
and ChromaTransformer2DModel):

- shapes: the released transformer config as data (the AE and T5-XXL are FLUX.1's,
  flux/shapes.py);
- conditioning: captions -> T5-XXL states and the padding mask the transformer attends with;
- lora_keys: kohya's module names of the original model for the transformer's Linears;
- original_keys: the name table between single-file (original) transformers and diffusers;
- files: the single files (transformer, FLUX.1's t5xxl and ae), each checked before a weight
  is read;
- family, load, sampling, entry: the ModelFamily the trainer calls, the ChromaPipeline folder
  loader, sampling through ChromaPipeline and the registry entry
  (library/models/families/registry.py lists it).

Its tiny test models and conformance kit are in tests/kits/chroma/.
"""
