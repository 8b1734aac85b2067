"""The speed, batch and first-call reports of the tiny random model on the CPU, built once per session."""

import contextlib
import json
import time

import pytest

from bench import batch, speed

CODEC_DELAY_S = 2.0
FRAMES = 6  # one line
LINES, LINE_FRAMES = 2, 4  # batch
FIRST_CALL_FRAMES = 4


@contextlib.contextmanager
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


def _written(main, args: list[str], path) -> dict:
    """main(args + --json path)'s report, checked to be what it wrote."""
    out = main(args + ["--json", str(path)])
    assert json.loads(path.read_text()) == out
    return out


@pytest.fixture(scope="session")
def speed_report(tiny_dir, tmp_path_factory):
    with slow_codec():
        return _written(speed.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32",
                                     "--frames", str(FRAMES), "--warm-frames", "3", "--prompts", "xvector",
                                     "--stacks", "upstream,auto:15,nosuch:5", "--agreement", ""],
                        tmp_path_factory.mktemp("speed") / "speed.json")


@pytest.fixture(scope="session")
def batch_report(tiny_dir, tmp_path_factory):
    with slow_codec():
        return _written(batch.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32",
                                     "--lines", str(LINES), "--frames", str(LINE_FRAMES), "--warm-frames", "2",
                                     "--batch-sizes", "2", "--seq-groups", "5", "--modes", "auto,nosuch"],
                        tmp_path_factory.mktemp("batch") / "batch.json")


@pytest.fixture(scope="session")
def first_call_report(tiny_dir, tmp_path_factory):
    return _written(speed.main, ["--first-call", "auto", "--model", str(tiny_dir), "--device", "cpu", "--dtype",
                                 "fp32", "--frames", str(FIRST_CALL_FRAMES), "--prompts", "xvector"],
                    tmp_path_factory.mktemp("first_call") / "first_call.json")
