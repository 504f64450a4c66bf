"""Taking the adapters a check put into the base model out again."""

from __future__ import annotations

from torch import nn


def remove_adapters(model: nn.Module) -> None:
    """Take every peft adapter out of ``model`` again (the base layers go back in place)."""
    from diffusers.utils.peft_utils import recurse_remove_peft_layers

    recurse_remove_peft_layers(model)
    for attr in ("peft_config",):
        if attr in vars(model):
            delattr(model, attr)
    if getattr(model, "_hf_peft_config_loaded", False):
        model._hf_peft_config_loaded = False
