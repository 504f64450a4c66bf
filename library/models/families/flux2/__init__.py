"""FLUX.2 (Black Forest Labs' klein 4B / 9B, base and distilled, and dev): the family in one
package. spec.py holds the loading facts as data; names.py the transformer's original <->
diffusers names; codec.py the latents; objective.py the training draw; lora_keys.py the LoRA
file names; family.py, load.py, sampling.py and entry.py what the trainer, the loader, the
sampler and the registry ask of it (docs/flux2.md)."""
