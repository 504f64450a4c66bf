"""The key map of Qwen-Image adapter files: ``diffusion_model.<diffusers path>``.

ComfyUI's Qwen-Image model keeps diffusers' module names (its checkpoint is
``model.diffusion_model.`` + the diffusers names), and its LoRA loader maps
``diffusion_model.<path>`` to them; diffusers' QwenImageLoraLoaderMixin reads the same files
(it drops the prefix and turns kohya's lora_down / lora_up / alpha into its lora_A / lora_B).
musubi-tuner's ``convert_lora.py --target other`` writes these names too. So a file holds
``diffusion_model.<path>.lora_down.weight``, ``.lora_up.weight`` and ``.alpha`` per Linear (a
LyCORIS file its kind's tensors under the same module names).
"""

from __future__ import annotations

from dataclasses import dataclass

from library.networks.key_maps import PathNames
from library.networks.kinds import kind_in
from library.networks.kohya_names import UNET, unwrap
from library.networks.module_files import adapted_modules

PREFIX = "diffusion_model."


@dataclass(frozen=True)
class QwenImageNames(PathNames):
    """``diffusion_model.<path>`` modules, written and read."""

    prefix: str = PREFIX

    def read(self, models, tensors, source):
        model = unwrap(models[UNET])
        modules = adapted_modules(model, self.modules(UNET, model))
        kind_in([model]).load_original_modules(model, modules, tensors, source)
