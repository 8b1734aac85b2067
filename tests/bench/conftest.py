"""What the speed and batch benchmark tests share."""

import time

import pytest

CODEC_DELAY_S = 2.0


@pytest.fixture(scope="module")
def slow_codec():
    """The codec decode (audio out) made CODEC_DELAY_S slower. End-to-end timings must grow by it and
    decode-only ones must not: on this shared CPU two runs of the same work differ by more than the tiny
    codec's own few milliseconds, so only a delay this size tells the two measurements apart reliably."""
    from morph.compat import import_qwen_tts

    import_qwen_tts()  # qwen_tts is imported through the compat shims only
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    original = Qwen3TTSTokenizer.decode

    def decode(self, *args, **kwargs):
        time.sleep(CODEC_DELAY_S)
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Qwen3TTSTokenizer, "decode", decode)
        yield
