"""Wan 2.1 text to video (1.3B, 14B) and image to video (I2V-14B, with its CLIP image states),
Wan 2.2 A14B's experts (text to video, or image to video from a clip's first frame) and Wan 2.2
TI2V-5B, one module per concern: keys (the original names as a name table), spec (the facts as
data for the shared loader), family (what the trainer calls: umT5 captions through
text_encoders/umt5.py, the transformer on 5-D latents of the channel-normalised video codec,
kohya's ten block Linears as LoRA modules, twelve for I2V-14B), t5_file (umT5 in the names of
Wan-AI's own T5 code), clip_file (the CLIP vision tower in the names of Wan-AI's own CLIP code),
experts (Wan 2.2 A14B's two transformers from a folder or musubi-tuner's dit / dit_high_noise
files), entry (the registry entry)."""
