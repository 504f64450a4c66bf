"""FLUX.1 (dev / schnell): model shapes, tiny test models and original <-> diffusers key names."""
