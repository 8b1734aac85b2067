"""The lean prefill on a GPU (morph/decode/prefill.py; the tiny model): fp32 gives upstream's talker forward to
rounding, as on the CPU (tests/morph/decode/test_prefill.py)."""

from __future__ import annotations

from tests.morph.decode.prefill_case import both, worst


def test_the_lean_prefill_is_upstreams_forward_on_the_gpu(cuda_tts):
    upstream, ours, pads = both(cuda_tts)
    assert all(w < 1e-4 for w in worst(upstream, ours, pads).values()), worst(upstream, ours, pads)
