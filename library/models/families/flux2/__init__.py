"""FLUX.2 (Black Forest Labs' klein 4B / 9B, base and distilled, and dev): the family in one
package. spec.py holds the models as data for the shared loader (parts, files); names.py the
transformer's original <-> diffusers name table (and so the LoRA file names), spec.py also
the training draw; family.py, sampling.py and entry.py what the trainer, the loader, the
sampler and the registry ask of it (docs/flux2.md)."""
