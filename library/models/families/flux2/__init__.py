"""FLUX.2 (Black Forest Labs' klein 4B / 9B, base and distilled, and dev): the family in one
package. spec.py holds the models as data for the shared loader (parts, files); names.py the
transformer's original <-> diffusers name table; codec.py the latents; objective.py the
training draw; lora_keys.py the LoRA file names; family.py, sampling.py and entry.py what the
trainer, the loader, the sampler and the registry ask of it (docs/flux2.md)."""
