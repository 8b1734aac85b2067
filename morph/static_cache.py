"""Static KV buffers for the code predictor's short, fixed-length decode.

Each frame the predictor sees at most 16 positions (a 2-token prefill, then one token
per group), so the buffers are allocated once per (batch, device, dtype) and
overwritten every frame: no DynamicCache, no per-step allocation or concatenation.
The object implements the one method HF attention layers call on a cache, `update`.
"""

from __future__ import annotations

import torch


class StaticKV:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_len: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype):
        shape = (batch, kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(num_layers)]
        self.length = 0

    def matches(self, batch: int, device: torch.device, dtype: torch.dtype) -> bool:
        k = self.keys[0]
        return k.shape[0] == batch and k.device == device and k.dtype == dtype

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: dict | None = None):
        """Write this step's keys/values at the current length; return everything so far."""
        start, end = self.length, self.length + key_states.shape[-2]
        self.keys[layer_idx][:, :, start:end] = key_states
        self.values[layer_idx][:, :, start:end] = value_states
        return self.keys[layer_idx][:, :, :end], self.values[layer_idx][:, :, :end]

    def advance(self, n: int) -> None:
        """Called once per pass, after every layer has written its n new positions."""
        self.length += n

    def reset(self) -> None:
        self.length = 0
