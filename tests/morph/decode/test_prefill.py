"""morph/decode/lean.py lean_prefill: the lean prefill gives upstream's talker forward's keys and values, last logits
and hidden state for a left-padded batch (tiny model, CPU, fp32), the left-padded row included, and keeps no more
memory than those keys and values."""

from __future__ import annotations

from .prefill_case import both, worst


def test_the_lean_prefill_is_upstreams_forward(tiny_tts):
    upstream, ours, pads = both(tiny_tts)
    assert pads[0] > 0 and pads[1] == 0  # the short line is left-padded
    assert all(w < 1e-5 for w in worst(upstream, ours, pads).values()), worst(upstream, ours, pads)
    assert len(ours.kv) == len(tiny_tts.patch.loop.stack.weights())


def test_the_kept_keys_and_values_hold_no_more_than_themselves(tiny_tts):
    """A group's prefill is kept until its rows joined: each layer's keys and values own their memory alone, not the
    layer's whole q/k/v projection they were split from (which held 2.5x as much a token at the 0.6B dims)."""
    _, ours, _ = both(tiny_tts)
    for k, v in ours.kv:
        for t in (k, v):
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
