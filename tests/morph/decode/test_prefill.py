"""morph/decode/prefill.py: the lean prefill gives upstream's talker forward's keys and values, last logits and hidden
state for a left-padded batch (tiny model, CPU, fp32), the left-padded row included."""

from __future__ import annotations

from .prefill_case import both, worst


def test_the_lean_prefill_is_upstreams_forward(tiny_tts):
    upstream, ours, pads = both(tiny_tts)
    assert pads[0] > 0 and pads[1] == 0  # the short line is left-padded
    assert all(w < 1e-5 for w in worst(upstream, ours, pads).values()), worst(upstream, ours, pads)
    assert len(ours.kv) == len(tiny_tts.patch.loop.stack.weights())
