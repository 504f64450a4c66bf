"""FLUX.1 Kontext [dev]: FLUX.1 dev's transformer trained to edit a reference image as the
caption says (entry.py, family.py, load.py, sampling.py; its tiny models are in
tests/kits/flux_kontext/)."""
