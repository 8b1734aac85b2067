"""morph.qwen.compat_cache: its wrappers are fed fakes with the 5.24 shape, so they work on any transformers
(tests/morph/qwen/test_compat.py checks them end to end on a tiny model)."""

import logging
from dataclasses import dataclass, fields

import pytest
import torch
from transformers.utils import ModelOutput

from morph.qwen import compat_cache as shims


@dataclass
class _TalkerOutput(ModelOutput):  # the shape of qwen-tts's two talker outputs
    logits: torch.Tensor | None = None
    past_key_values: object = None
    hidden_states: tuple | None = None


@pytest.fixture
def deprecation_logs(monkeypatch):
    """What transformers logs once per process (5.24's note on the old cache name among them), every time."""
    said = []

    def warning_once(self, msg, *args, **kwargs):
        said.append(msg % args if args else msg)

    monkeypatch.setattr(logging.Logger, "warning_once", warning_once)
    return said


def test_output_with_cache_field_keeps_past_key_values_as_a_silent_alias(deprecation_logs):
    output = shims.with_cache_field(_TalkerOutput)
    assert output.__name__ == "_TalkerOutput"
    assert [f.name for f in fields(output)] == ["logits", "cache", "hidden_states"]
    logits = torch.zeros(1)
    out = output(logits=logits, past_key_values="kv")  # how qwen-tts builds it
    assert out.cache == "kv" and out.past_key_values == "kv"  # and how qwen-tts and the pack read it
    assert "cache" in out and out["cache"] == "kv" and list(out.keys()) == ["logits", "cache"]  # how generate reads it
    assert out.to_tuple() == (logits, "kv")
    assert output(logits, "kv").cache == "kv" and output(cache="kv").past_key_values == "kv"
    with pytest.raises(TypeError, match="both"):
        output(cache="a", past_key_values="b")
    assert deprecation_logs == []


def test_forward_takes_the_cache_as_524s_generate_passes_it():
    def forward(self, input_ids=None, past_key_values=None, **kwargs):  # qwen-tts's: the rest goes to its layers
        return past_key_values, kwargs

    wrapped = shims.accept_cache_kwarg(forward)
    assert wrapped(None, cache="kv", use_cache=True) == ("kv", {"use_cache": True})
    assert wrapped(None, past_key_values="kv") == ("kv", {})  # the pack's own calls, and 4.57's generate
    with pytest.raises(TypeError, match="both"):
        wrapped(None, cache="a", past_key_values="b")
