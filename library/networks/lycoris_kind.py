"""LyCORIS' LoCon/LoHa/LoKr (optionally DoRA) as an adapter kind (``lycoris.kohya``).

Layers are our LycorisLayer (library/networks/lycoris/layer.py), one per target layer, or one
per file module over an original model's fused layer (library/networks/lycoris_fused.py). A
module's file tensors are the layer's own (``hada_w1_a``, ``lokr_w1``, ``lora_down.weight``,
``alpha``, ``dora_scale``, ...), which the layer writes, checks and loads.
"""

from __future__ import annotations

from torch import nn

from library.config.adapter_schema import lycoris_spec
from library.errors import ConfigError
from library.networks.kind_base import AdapterKind, AdapterSettings, FileModule
from library.networks.lora import LoraSpec
from library.networks.lycoris.layer import LycorisLayer
from library.networks.lycoris_fused import (
    MODULES,
    LycorisPart,
    apply_module_lycoris,
    import_module_lycoris,
)
from library.networks.lycoris_inject import apply_lycoris
from library.networks.lycoris_targets import PRESETS, trains_text_encoders

_ALGO_NAMES = {"lora": "LoCon", "locon": "LoCon", "loha": "LoHa", "lokr": "LoKr"}


class LycorisKind(AdapterKind):
    name = "lycoris"
    network_modules = ("lycoris.kohya",)
    loraplus_refusal = "LyCORIS adapters"

    def settings(self, config) -> AdapterSettings:

        net, adapter = config.network, config.adapter
        lora = LoraSpec(net.network_dim, net.network_alpha, net.conv_dim, net.conv_alpha)
        try:
            spec = lycoris_spec(config)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return AdapterSettings(lora, spec, adapter.preset or "full", kind=self.name)

    def plan_name(self, config) -> str:
        adapter = config.adapter
        name = f"LyCORIS {_ALGO_NAMES[adapter.algo or 'lora']}"
        return name + (" + DoRA" if adapter.dora_wd else "")

    def plan_parts(self, config, where: str) -> list[str]:
        net, adapter = config.network, config.adapter
        preset = adapter.preset or "full"
        if not trains_text_encoders(preset):
            where = "denoiser only"
        parts = []
        if PRESETS[preset].convs:
            conv_dim = net.conv_dim or net.network_dim
            parts.append(
                f"kxk convs rank {conv_dim}, alpha {net.conv_alpha or net.network_alpha:g}"
            )
        options = [
            f"factor {adapter.factor}" if adapter.factor not in (None, -1) else "",
            "both Kronecker halves factored" if adapter.decompose_both else "",
            "full second Kronecker half" if adapter.full_matrix else "",
            "Tucker cores on convs" if adapter.use_tucker else "",
            "trained scalar" if adapter.use_scalar else "",
            "rank-stabilised scale" if adapter.rs_lora else "",
            "DoRA per input channel" if adapter.dora_wd and adapter.wd_on_output is False else "",
        ]
        parts += [o for o in options if o]
        parts.append(f"preset {preset} ({where})")
        return parts

    def trains_text_encoders(self, settings) -> bool:
        return trains_text_encoders(settings.preset)

    def inject(self, family, module, role, settings):
        """The preset's layers as ``family`` chooses them: one layer per file module where the
        family's original model fuses layers diffusers splits (the family defines
        ``lycoris_modules(denoiser, preset)``, its key-map entries), else one per target layer
        (``lycoris_targets``)."""
        fused = getattr(family, "lycoris_modules", None)
        if fused is not None and role == "unet":
            modules = fused(module, settings.preset)
            return apply_module_lycoris(module, modules, settings.spec)
        targets = family.lycoris_targets(module, role, settings.preset)
        return apply_lycoris(module, targets, settings.spec)

    def inject_targets(self, model, targets, settings):
        return apply_lycoris(model, targets, settings.spec)

    def layers(self, model):
        return {path: m for path, m in model.named_modules() if isinstance(m, LycorisLayer)}

    def layer_parameters(self, layer):
        return layer.adapter_parameters()

    def saved_numbers(self, model):
        return sum(layer.saved_numbers() for layer in self.layers(model).values())

    # -- files -------------------------------------------------------------------------------

    def file_layers(self, model):
        """Each adapted model layer: a LycorisLayer in its place, or a LycorisPart adding its
        rows of a fused layer's change (the shared layers themselves are not model layers)."""
        return {
            path: m
            for path, m in model.named_modules()
            if isinstance(m, LycorisPart)
            or (isinstance(m, LycorisLayer) and not path.startswith(MODULES + "."))
        }

    def module_layer(self, file_layers, module: FileModule):
        found = [file_layers.get(path) for path in module.parts]
        if all(layer is None for layer in found):
            return None
        shared = {id(_shared(layer)): _shared(layer) for layer in found if layer is not None}
        if None in found or len(shared) != 1:
            raise ValueError(
                f"{module.name} stands for {', '.join(module.parts)}, which are not adapted as "
                "one LyCORIS layer"
            )
        layer = next(iter(shared.values()))
        rows = getattr(found[-1], "rows", None)
        if rows is not None and (found[0].rows[0] != 0 or rows[1] != layer.weight_shape[0]):
            raise ValueError(f"{module.name}'s layers are only part of one LyCORIS layer")
        return layer

    def export_layer(self, layer):
        return layer.file_tensors()

    def check_layer(self, layer, tensors, where):
        layer.check_file_tensors(tensors, where)

    def load_layer(self, layer, tensors, where):
        layer.load_file_tensors(tensors, where)

    def load_original_modules(self, model, modules, tensors, source):
        """Each fused module into its one LycorisLayer (library.networks.lycoris_fused)."""
        import_module_lycoris(model, tensors, source)


def _shared(layer: nn.Module) -> nn.Module:
    """The LycorisLayer whose change ``layer`` applies (itself, or a LycorisPart's shared one)."""
    return layer._shared if isinstance(layer, LycorisPart) else layer


LYCORIS = LycorisKind()
