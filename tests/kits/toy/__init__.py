"""A made-up family, "Toy", declared the way a real one is (docs/design.md, "Adding a family"):
its spec (spec.py: a made-up pipeline, made-up original names), its small family class
(family.py: composed from the shared T5 kind, 2x2 patch tokens and the flow objective), its
registry entry (entry.py) and its tiny models (tiny.py). It is registered only inside
tests/integration/test_made_up_family.py, which loads and trains it; it has no conformance kit.

The denoiser is diffusers' BriaTransformer2DModel, which no registered family uses."""
