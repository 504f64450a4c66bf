"""``LycorisLayer``: one Linear/Conv2d of a model with a LoCon, LoHa or LoKr adapter (and DoRA).

The layer keeps the original module as ``base_layer`` (frozen) and owns the adapter tensors in
float32, shaped exactly as LyCORIS' saved files hold them, so ``file_tensors`` is a plain copy.
What the adapter computes, its initialisation and its scale follow LyCORIS 4.x
(``lycoris.modules.locon/loha/lokr``, weight-rebuild mode):

* scale ``alpha / rank`` (rsLoRA: ``alpha / sqrt(rank)``, saved as alpha ``alpha·sqrt(rank)`` so
  any reader's ``alpha / rank`` gives the same scale); alpha 0 means alpha = rank; a LoKr layer
  whose two Kronecker halves are both full matrices has scale 1 whatever alpha says.
* ``use_scalar``: a trainable scalar, starting at 0, multiplies the change, and the factor that is
  otherwise zero-initialised starts random instead. Files hold the scalar folded into
  ``lora_up.weight``/``hada_w1_a``/``lokr_w1``(``_a``), never as a tensor of its own.
* DoRA (``dora_wd``): a trainable ``dora_scale`` (the base weight's norms, per output row with
  ``wd_on_output`` and per input column without) rescales ``V = W + ΔW`` to
  ``V · (m·(g/‖V‖ − 1) + 1)`` for multiplier ``m``; the norm is not detached.
* initialisation leaves ΔW = 0 (LoCon up, LoHa w2_a, LoKr w2/w2_b start at zero); the random
  factors use LyCORIS' distributions (Kaiming-uniform with a=√5, LoHa normals).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from library.errors import CheckpointError
from library.networks.lycoris import file_math
from library.networks.lycoris.factorize import factorization
from library.networks.lycoris.spec import LayerKind, LycorisSpec

_LABELS = {"locon": "LoCon/LoRA", "loha": "LoHa", "lokr": "LoKr"}


def _attr(suffix: str) -> str:
    """The attribute holding a file suffix's tensor (``lora_up.weight`` -> ``lora_up``)."""
    return suffix.removesuffix(".weight")


def layer_kind(base_layer: nn.Module) -> LayerKind:
    """ "linear" for Linear and 1x1 convs (they take network_dim/alpha), "conv" for kxk convs."""
    if isinstance(base_layer, nn.Linear):
        return "linear"
    if isinstance(base_layer, nn.Conv2d):
        return "linear" if all(k == 1 for k in base_layer.kernel_size) else "conv"
    raise ValueError(f"LyCORIS adapts nn.Linear and nn.Conv2d, not {type(base_layer).__name__}")


class LycorisLayer(nn.Module):
    """A Linear or Conv2d (groups=1) plus one LyCORIS adapter; see the module docstring.

    ``kind`` is "linear" (Linear or 1x1 conv: ``spec.dim``/``spec.alpha``) or "conv" (kxk conv:
    ``spec.conv_dim``/``spec.conv_alpha``). ``generator`` (a torch.Generator or an int seed)
    makes the random initialisation deterministic; None draws from torch's global generator.
    """

    def __init__(
        self,
        base_layer: nn.Module,
        spec: LycorisSpec,
        kind: LayerKind,
        generator: torch.Generator | int | None = None,
    ) -> None:
        super().__init__()
        expected_kind = layer_kind(base_layer)
        if kind != expected_kind:
            raise ValueError(
                f"a {type(base_layer).__name__} with weight {list(base_layer.weight.shape)} is a "
                f'"{expected_kind}" layer for LyCORIS, not "{kind}"'
            )
        if isinstance(base_layer, nn.Conv2d):
            if base_layer.groups != 1:
                raise ValueError(
                    f"LyCORIS layers need groups=1 convs, got groups={base_layer.groups}"
                )
            if base_layer.padding_mode != "zeros":
                raise ValueError(
                    f"LyCORIS layers need zero-padded convs, got padding_mode={base_layer.padding_mode}"
                )
        if isinstance(generator, int):
            generator = torch.Generator().manual_seed(generator)
        base_layer.requires_grad_(False)
        self.base_layer = base_layer
        self.spec = spec
        self.kind = kind
        self.algo = spec.module_algo
        self.rank = spec.rank_for(kind)
        self.multiplier = 1.0
        self.weight_shape = tuple(int(s) for s in base_layer.weight.shape)
        self.is_conv = isinstance(base_layer, nn.Conv2d)
        kernel = self.weight_shape[2:]
        self.tucker = self.is_conv and spec.use_tucker and any(k != 1 for k in kernel)
        self.lokr_w1_full = self.lokr_w2_full = False

        layout = self._layout()
        device = base_layer.weight.device
        for suffix, shape in layout.items():
            if suffix not in ("alpha", "dora_scale"):
                param = torch.empty(shape, dtype=torch.float32)
                self.register_parameter(_attr(suffix), nn.Parameter(param))
        self._file_layout = layout
        self._init_factors(generator)
        if spec.use_scalar:
            self.scalar = nn.Parameter(torch.zeros((), dtype=torch.float32))
        else:
            # max-norm scales this (as LyCORIS does); persistent so a resumed run keeps it.
            self.register_buffer("scalar", torch.ones((), dtype=torch.float32))

        alpha = spec.alpha_for(kind) or float(self.rank)
        if not self._has_rank():
            alpha = float(self.rank)  # LyCORIS forces alpha = rank (no scaling) here
        r_factor = math.sqrt(self.rank) if spec.rs_lora else float(self.rank)
        self.scale = alpha / r_factor
        if not self._has_rank():
            # Readers (LyCORIS' loader, ComfyUI) give such a module scale 1, so we train with
            # it too; with rs_lora LyCORIS' trainer alone would use rank / sqrt(rank) here.
            self.scale = 1.0
        self.register_buffer(
            "alpha", torch.tensor(alpha * self.rank / r_factor, dtype=torch.float32)
        )
        if spec.dora_wd:
            weight = base_layer.weight.detach().float()
            if spec.wd_on_output:
                norm = weight.reshape(weight.shape[0], -1).norm(dim=1)
                norm = norm.reshape(weight.shape[0], *(1,) * (weight.dim() - 1))
            else:
                norm = weight.transpose(0, 1).reshape(weight.shape[1], -1).norm(dim=1)
                norm = norm.reshape(1, weight.shape[1], *(1,) * (weight.dim() - 2))
            # a shapes-only base layer (the dry run's, on the meta device) has no data to move
            self.dora_scale = nn.Parameter(norm if norm.is_meta else norm.cpu())
        self.to(device)
        # A model-level load_state_dict may bring another alpha; the scale follows it.
        self.register_load_state_dict_post_hook(_refresh_scale)

    # ----------------------------------------------------------------------------- structure
    def _layout(self) -> dict[str, tuple[int, ...]]:
        """File suffix -> shape of every tensor this layer saves (sets the LoKr flags)."""
        out_dim, in_dim, *kernel = self.weight_shape
        kernel = tuple(kernel)
        ones = (1,) * len(kernel)
        k_numel = math.prod(kernel)
        r = self.rank
        spec = self.spec
        layout: dict[str, tuple[int, ...]] = {}
        if self.algo == "locon":
            if self.tucker:
                layout["lora_down.weight"] = (r, in_dim, *ones)
                layout["lora_mid.weight"] = (r, r, *kernel)
            else:
                layout["lora_down.weight"] = (r, in_dim, *kernel)
            layout["lora_up.weight"] = (out_dim, r, *ones)
        elif self.algo == "loha":
            for half in ("1", "2"):
                if self.tucker:
                    layout[f"hada_w{half}_a"] = (r, out_dim)
                    layout[f"hada_w{half}_b"] = (r, in_dim)
                    layout[f"hada_t{half}"] = (r, r, *kernel)
                else:
                    layout[f"hada_w{half}_a"] = (out_dim, r)
                    layout[f"hada_w{half}_b"] = (r, in_dim * k_numel)
        else:
            a, b = factorization(out_dim, spec.factor)
            if spec.unbalanced_factorization:
                a, b = b, a
            c, d = factorization(in_dim, spec.factor)
            if spec.decompose_both and r < max(a, c) / 2 and not spec.full_matrix:
                layout["lokr_w1_a"] = (a, r)
                layout["lokr_w1_b"] = (r, c)
            else:
                self.lokr_w1_full = True
                layout["lokr_w1"] = (a, c)
            if r >= max(b, d) / 2 or spec.full_matrix:
                self.lokr_w2_full = True
                layout["lokr_w2"] = (b, d, *kernel)
                self.tucker = False  # the full w2 carries the kernel itself
            elif self.tucker:
                layout["lokr_w2_a"] = (r, b)
                layout["lokr_w2_b"] = (r, d)
                layout["lokr_t2"] = (r, r, *kernel)
            else:
                layout["lokr_w2_a"] = (b, r)
                layout["lokr_w2_b"] = (r, d * k_numel)
        layout["alpha"] = ()
        if spec.dora_wd:
            layout["dora_scale"] = (out_dim, 1, *ones) if spec.wd_on_output else (1, in_dim, *ones)
        return layout

    @torch.no_grad()
    def _init_factors(self, generator: torch.Generator | None) -> None:
        """LyCORIS' initialisation: ΔW starts at 0 unless use_scalar (then the scalar is 0)."""

        def kaiming(name: str) -> None:
            nn.init.kaiming_uniform_(getattr(self, name), a=math.sqrt(5), generator=generator)

        def normal(name: str, std: float) -> None:
            nn.init.normal_(getattr(self, name), std=std, generator=generator)

        def zero(name: str) -> None:
            nn.init.zeros_(getattr(self, name))

        # With use_scalar the scalar starts at 0 instead, so the last factor may start random.
        last = kaiming if self.spec.use_scalar else zero
        if self.algo == "locon":
            kaiming("lora_down")
            if self.tucker:
                kaiming("lora_mid")
            last("lora_up")
        elif self.algo == "loha":
            if self.tucker:
                normal("hada_t1", 0.1)
                normal("hada_t2", 0.1)
            normal("hada_w1_b", 1.0)
            normal("hada_w1_a", 0.1)
            normal("hada_w2_b", 1.0)
            if self.spec.use_scalar:
                normal("hada_w2_a", 0.1)
            else:
                zero("hada_w2_a")
        else:
            if self.lokr_w2_full:
                last("lokr_w2")
            else:
                if self.tucker:
                    kaiming("lokr_t2")
                kaiming("lokr_w2_a")
                last("lokr_w2_b")
            if self.lokr_w1_full:
                kaiming("lokr_w1")
            else:
                kaiming("lokr_w1_a")
                kaiming("lokr_w1_b")

    def _factor_suffixes(self) -> list[str]:
        return [s for s in self._file_layout if s not in ("alpha", "dora_scale")]

    def _part(self, suffix: str) -> torch.Tensor | None:
        return getattr(self, _attr(suffix)) if suffix in self._file_layout else None

    def _has_rank(self) -> bool:
        """False for a LoKr layer whose halves are both full matrices (no rank in its shapes)."""
        return not (self.algo == "lokr" and self.lokr_w1_full and self.lokr_w2_full)

    def _scalar_suffix(self) -> str:
        """The saved factor the scalar is folded into."""
        if self.algo == "locon":
            return "lora_up.weight"
        if self.algo == "loha":
            return "hada_w1_a"
        return "lokr_w1" if self.lokr_w1_full else "lokr_w1_a"

    # ------------------------------------------------------------------------------- weights
    def _raw_delta(self) -> torch.Tensor:
        """ΔW before scale and scalar, float32, with autograd."""
        shape = self.weight_shape
        if self.algo == "locon":
            return file_math.rebuild_locon(
                self.lora_down, self.lora_up, self._part("lora_mid.weight"), shape
            )
        if self.algo == "loha":
            return file_math.rebuild_loha(*(self._part(k) for k in file_math.LOHA_KEYS), shape)
        return file_math.rebuild_lokr(*(self._part(k) for k in file_math.LOKR_KEYS), shape)

    def _delta(self) -> torch.Tensor:
        """scale · scalar · ΔW, float32, with autograd."""
        return self._raw_delta() * (self.scalar * self.scale)

    def _combined(self, delta: torch.Tensor, multiplier: float) -> torch.Tensor:
        """The weight the layer computes with, given its (scaled) change ``delta``."""
        weight = self.base_layer.weight.detach().float()
        if self.spec.dora_wd:
            return file_math.weight_decompose(
                weight + delta, self.dora_scale, multiplier, self.spec.wd_on_output
            )
        return weight + delta * multiplier

    @torch.no_grad()
    def delta_weight(self) -> torch.Tensor:
        """The adapter's weight change (scale included, multiplier and DoRA not), float32."""
        return self._delta().detach().clone()

    @torch.no_grad()
    def merged_weight(self, multiplier: float = 1.0) -> torch.Tensor:
        """The full float32 weight the layer computes with at ``multiplier`` (DoRA applied)."""
        return self._combined(self._delta(), multiplier).detach().clone()

    # ------------------------------------------------------------------------------- forward
    def _op(self, x: torch.Tensor, weight: torch.Tensor, *, geometry: bool = True) -> torch.Tensor:
        if not self.is_conv:
            return F.linear(x, weight)
        if not geometry:
            return F.conv2d(x, weight)
        base = self.base_layer
        return F.conv2d(x, weight, None, base.stride, base.padding, base.dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base_out = self.base_layer(x)
        dtype = x.dtype
        if self.algo == "locon" and not self.spec.dora_wd:
            # Through the factors (down, [mid,] up): never builds the full ΔW.
            if self.tucker:
                h = self._op(x, self.lora_down.to(dtype), geometry=False)
                h = self._op(h, self.lora_mid.to(dtype))
            else:
                h = self._op(x, self.lora_down.to(dtype))
            h = self._op(h, self.lora_up.to(dtype), geometry=False)
            gain = self.scalar * (self.scale * self.multiplier)
            return base_out + h * gain.to(dtype)
        return base_out + self._op(x, self.weight_change().to(dtype))

    def weight_change(self) -> torch.Tensor:
        """What the adapter adds to the base weight at ``multiplier``, float32, with autograd:
        ``multiplier * delta``, or with DoRA the decomposed weight minus the base weight."""
        delta = self._delta()
        if self.spec.dora_wd:
            return self._combined(delta, self.multiplier) - self.base_layer.weight.float()
        return delta * self.multiplier

    # ---------------------------------------------------------------------------------- files
    def adapter_parameters(self) -> list[nn.Parameter]:
        """The trained tensors: the factors, then the scalar (use_scalar), then dora_scale."""
        params = [getattr(self, _attr(s)) for s in self._factor_suffixes()]
        if self.spec.use_scalar:
            params.append(self.scalar)
        if self.spec.dora_wd:
            params.append(self.dora_scale)
        return params

    @torch.no_grad()
    def file_tensors(self) -> dict[str, torch.Tensor]:
        """This module's tensors under LyCORIS' suffixes, as its saved files hold them.

        Detached float32 copies; the scalar is folded into one factor; ``alpha`` is 0-d.
        """
        folded = self._scalar_suffix()
        tensors: dict[str, torch.Tensor] = {}
        for suffix in self._factor_suffixes():
            value = getattr(self, _attr(suffix)).detach().float()
            if suffix == folded:
                value = value * self.scalar.detach().float()
            tensors[suffix] = value.clone()
        tensors["alpha"] = self.alpha.detach().float().clone()
        if self.spec.dora_wd:
            tensors["dora_scale"] = self.dora_scale.detach().float().clone()
        return tensors

    def saved_numbers(self) -> int:
        """How many numbers :meth:`file_tensors` holds."""
        return sum(math.prod(shape) for shape in self._file_layout.values())

    def _mismatch(self, source: str, tensors: Mapping[str, torch.Tensor]) -> str | None:
        """Why ``tensors`` cannot load into this layer, as one sentence, or None."""
        spec = self.spec
        try:
            algo = file_math.module_algo(tensors)
        except ValueError as err:
            return f"{source}: {err}"
        if algo != self.algo:
            keys = [k for k in file_math.ALGO_KEYS[algo] if k in tensors]
            suggestion = "lora" if algo == "locon" else algo
            return (
                f"{source} holds a {_LABELS[algo]} module ({', '.join(keys)}) but network_args "
                f"says algo={spec.algo}; set algo={suggestion}"
            )
        expected = set(self._file_layout)
        present = set(tensors)
        if "dora_scale" in present - expected:
            return (
                f"{source} holds dora_scale (a DoRA module) but network_args has dora_wd=false; "
                "set dora_wd=true"
            )
        if "dora_scale" in expected - present:
            return (
                f"{source} lacks dora_scale (not a DoRA module) but network_args has "
                "dora_wd=true; set dora_wd=false"
            )
        if "alpha" not in present:
            return f"{source} lacks the module's alpha tensor, which LyCORIS files always hold"
        tucker_keys = {"lora_mid.weight", "hada_t1", "hada_t2", "lokr_t2"}
        extra_tucker = sorted((present - expected) & tucker_keys)
        if extra_tucker and not any(k != 1 for k in self.weight_shape[2:]):
            return (
                f"{source} holds {extra_tucker[0]} (a Tucker-decomposed conv module), which "
                f"cannot adapt this {list(self.weight_shape)} layer"
            )
        if extra_tucker and not self.tucker and not self.lokr_w2_full:
            return (
                f"{source} holds {extra_tucker[0]} (a Tucker-decomposed conv module) but this "
                "layer is built without it (use_tucker=false); set use_tucker=true"
            )
        missing_tucker = sorted((expected - present) & tucker_keys)
        if missing_tucker:
            return (
                f"{source} lacks {missing_tucker[0]} (not a Tucker-decomposed module) but "
                "network_args has use_tucker=true; set use_tucker=false"
            )
        if present != expected:
            extra = sorted(present - expected)
            missing = sorted(expected - present)
            detail = (
                f"holds {extra[0]} where this config expects {missing[0]}"
                if extra and missing
                else f"holds an unexpected {extra[0]}"
                if extra
                else f"lacks {missing[0]}"
            )
            hint = (
                "; the file's LoKr halves are split differently: check decompose_both, "
                "full_matrix, network_dim/conv_dim and factor"
                if algo == "lokr"
                else ""
            )
            return f"{source} {detail}{hint}"
        # Same suffixes: compare the rank, the DoRA axis, then every shape.
        file_rank = file_math.module_rank(tensors)
        if file_rank is not None and self._has_rank() and file_rank != self.rank:
            key = spec.rank_key(self.kind)
            return (
                f"{source} holds a rank-{file_rank} module but network_args gives this "
                f"{self.kind} layer rank {self.rank}; set {key}={file_rank}"
            )
        if self.spec.dora_wd:
            got = tuple(tensors["dora_scale"].shape)
            if got != self._file_layout["dora_scale"]:
                flipped = not spec.wd_on_output
                try:
                    on_out = file_math.dora_on_output(tensors["dora_scale"], self.weight_shape)
                except ValueError:
                    on_out = None
                if on_out is flipped:
                    return (
                        f"{source} holds dora_scale of shape {list(got)}, which is DoRA with "
                        f"wd_on_output={str(flipped).lower()}, but network_args says "
                        f"wd_on_output={str(spec.wd_on_output).lower()}; set "
                        f"wd_on_output={str(flipped).lower()}"
                    )
        for suffix, shape in self._file_layout.items():
            got = tuple(tensors[suffix].shape)
            if suffix == "alpha":
                if tensors[suffix].numel() != 1:
                    return f"{source}: alpha has shape {list(got)}, expected one number"
                value = float(tensors[suffix].float().item())
                if not math.isfinite(value):
                    return f"{source}: alpha is {value}, not a finite number"
                continue
            if got != shape:
                hint = (
                    "; the file was made with another factor/unbalanced_factorization"
                    if algo == "lokr"
                    else ""
                )
                return (
                    f"{source}: {suffix} has shape {list(got)} but this config's "
                    f"{list(self.weight_shape)} layer expects {list(shape)}{hint}"
                )
            if not tensors[suffix].is_floating_point():
                return f"{source}: {suffix} holds {tensors[suffix].dtype}, not floating point"
        return None

    def check_file_tensors(self, tensors: Mapping[str, torch.Tensor], source: str) -> None:
        """CheckpointError (as :meth:`load_file_tensors` gives) when ``tensors`` do not fit this
        layer; lets a caller check every module of a file before it loads any."""
        problem = self._mismatch(source, tensors)
        if problem is not None:
            raise CheckpointError(problem)

    @torch.no_grad()
    def load_file_tensors(self, tensors: Mapping[str, torch.Tensor], source: str) -> None:
        """Load a saved module's ``{suffix: tensor}`` (the inverse of :meth:`file_tensors`).

        Everything is checked before anything is copied; a mismatch is a CheckpointError naming
        ``source``, the suffix and the network_args fix. The file's alpha replaces the configured
        one (and so sets the scale); the scalar is reset to 1 because files hold it folded.
        """
        self.check_file_tensors(tensors, source)
        for suffix in self._factor_suffixes():
            getattr(self, _attr(suffix)).copy_(tensors[suffix])
        if self.spec.dora_wd:
            self.dora_scale.copy_(tensors["dora_scale"])
        self.scalar.fill_(1.0)
        self.alpha.fill_(float(tensors["alpha"].float().item()))
        self._refresh_scale()

    def _refresh_scale(self) -> None:
        """Set the scale from the alpha buffer as a file reader would (alpha 0: scale 1)."""
        if self._has_rank():
            alpha = float(self.alpha)
            self.scale = alpha / self.rank if alpha != 0 else 1.0

    # ------------------------------------------------------------------------------ max-norm
    @torch.no_grad()
    def apply_max_norm(self, limit: float) -> tuple[float, bool]:
        """kohya's scale_weight_norms for this module: if ‖ΔW‖ > limit, shrink ΔW onto it.

        Returns (the norm before, whether it was scaled). As in LyCORIS, LoCon and LoHa shrink
        through the scalar, LoKr by multiplying each of its n factors by ratio^(1/n).
        """
        if not limit > 0:
            raise ValueError(f"the max-norm limit must be > 0, got {limit}")
        norm = float(self._delta().norm())
        if not norm > limit:
            return norm, False
        ratio = limit / norm
        if self.algo in ("locon", "loha"):
            self.scalar.mul_(ratio)
        else:
            factors = self._factor_suffixes()
            root = ratio ** (1.0 / len(factors))
            for suffix in factors:
                getattr(self, _attr(suffix)).mul_(root)
        return norm, True

    def extra_repr(self) -> str:
        return (
            f"algo={self.algo}, kind={self.kind}, rank={self.rank}, scale={self.scale:.6g}, "
            f"tucker={self.tucker}, dora={self.spec.dora_wd}"
        )


def _refresh_scale(module: LycorisLayer, incompatible_keys: object) -> None:
    module._refresh_scale()
