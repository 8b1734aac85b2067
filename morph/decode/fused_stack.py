"""A decoder stack's weights as lean.py's LayerW: q/k/v and gate/up each fused into one tensor the parameters view."""

from __future__ import annotations

import torch

from .lean import LayerW, dims_of


def _fuse(linears: list[torch.nn.Linear]) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():
        fused = torch.cat([m.weight.detach() for m in linears])
        start = 0
        for m in linears:
            n = m.weight.shape[0]
            m.weight = torch.nn.Parameter(fused[start:start + n], requires_grad=False)
            start += n
    return fused


def _views_of(fused: torch.Tensor | None, linears: list[torch.nn.Linear]) -> bool:
    if fused is None:
        return False
    # addresses, not slices of `fused`: a render checks every layer's weights, and a slice is a new tensor each
    base, row, start = fused.data_ptr(), fused.stride(0) * fused.element_size(), 0
    for m in linears:
        w = m.weight
        if w.device != fused.device or w.dtype != fused.dtype or w.data_ptr() != base + start * row:
            return False
        start += w.shape[0]
    return start == fused.shape[0]


def unfuse(linears: list[torch.nn.Linear]) -> None:
    """Give each module its own copy of its weight again (undoes _fuse and a Predictor's stacking)."""
    with torch.inference_mode(False), torch.no_grad():
        for m in linears:
            m.weight = torch.nn.Parameter(m.weight.detach().clone(), requires_grad=False)


def _layer_w(layer, wqkv: torch.Tensor, wgu: torch.Tensor) -> LayerW:
    a = layer.self_attn
    return LayerW(layer.input_layernorm.weight, wqkv, a.q_norm.weight, a.k_norm.weight, a.o_proj.weight,
                  layer.post_attention_layernorm.weight, wgu, layer.mlp.down_proj.weight)


class FusedStack:
    """One decoder stack's layers, fused. `weights()` fuses again whenever the parameters stopped viewing the fused
    tensors (a memory manager moved or cast the model) and changes `version`, so graphs on the old storage go."""

    def __init__(self, layers, norm: torch.nn.Module, config):
        self.layers = list(layers)
        self.norm = norm
        self.dims = dims_of(config)
        self._fused: list[tuple[torch.Tensor | None, torch.Tensor | None]] = [(None, None)] * len(self.layers)
        self._weights: list[LayerW] | None = None
        self.version = 0

    @staticmethod
    def _groups(layer):
        a, m = layer.self_attn, layer.mlp
        return [a.q_proj, a.k_proj, a.v_proj], [m.gate_proj, m.up_proj]

    def weights(self) -> list[LayerW]:
        stale = False
        for i, layer in enumerate(self.layers):
            qkv, gu = self._groups(layer)
            fq, fg = self._fused[i]
            if not (_views_of(fq, qkv) and _views_of(fg, gu)):
                self._fused[i] = (_fuse(qkv), _fuse(gu))
                stale = True
        if stale or self._weights is None:
            self.version += 1
            self._weights = [_layer_w(layer, fq, fg) for layer, (fq, fg) in zip(self.layers, self._fused, strict=True)]
        # norms and the other projections can be replaced by a move too: re-read them
        for i, (layer, w) in enumerate(zip(self.layers, self._weights)):
            if w.ln1 is not layer.input_layernorm.weight or w.wo is not layer.self_attn.o_proj.weight \
                    or w.wd is not layer.mlp.down_proj.weight or w.ln2 is not layer.post_attention_layernorm.weight:
                self._weights[i] = _layer_w(layer, w.wqkv, w.wgu)
                self.version += 1
        return self._weights

    def fingerprint(self) -> tuple:
        """Addresses of every tensor the step reads: equal fingerprints, same graphs."""
        ws = self.weights()
        return (self.version, self.norm.weight.data_ptr(), tuple(t.data_ptr() for w in ws for t in w))

    def release(self) -> None:
        """Give every projection its own storage again, a layer at a time, so a full card needs one layer's more."""
        self._weights = None
        for i, layer in enumerate(self.layers):
            if self._fused[i][0] is not None:
                qkv, gu = self._groups(layer)
                unfuse(qkv)
                unfuse(gu)
            self._fused[i] = (None, None)
        self.version += 1
