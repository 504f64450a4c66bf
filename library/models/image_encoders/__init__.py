"""Image encoders whose states condition a denoiser beside the caption's (CLIP's vision tower
for image-to-video models)."""
