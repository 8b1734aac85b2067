"""The speed, batch and first-call reports of the tiny random model on the CPU, built once per session."""

import contextlib
import json
import time
import types

import pytest

from bench import batch, speed

CODEC_DELAY_S = 2.0
TICK_S = 0.001  # the fake clock's step between two readings
FRAMES = 6  # one line
REPEATS = 3  # each stack's runs end to end, decode only and of its codec
LINES, LINE_FRAMES = 2, 4  # batch
FIRST_CALL_FRAMES = 4


@contextlib.contextmanager
def fake_clock():
    """bench's clock made of the work, not the machine: every reading of time.perf_counter in bench.speed
    and bench.batch is TICK_S after the one before, and each codec decode (audio out) takes CODEC_DELAY_S.
    A report's timings are then exact: end to end must be decode only plus the codec's delays, however
    loaded the machine is, and a timer put around the wrong work shows as a wrong sum."""
    from morph.qwen.compat import import_qwen_tts

    import_qwen_tts()  # qwen_tts is imported through the compat shims only
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    now = [0.0]

    def perf_counter():
        now[0] += TICK_S
        return now[0]

    original = Qwen3TTSTokenizer.decode

    def decode(self, *args, **kwargs):
        now[0] += CODEC_DELAY_S
        return original(self, *args, **kwargs)

    clock = types.SimpleNamespace(perf_counter=perf_counter, time=time.time, sleep=time.sleep)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Qwen3TTSTokenizer, "decode", decode)
        mp.setattr(speed, "time", clock)
        mp.setattr(batch, "time", clock)
        yield


def _written(main, args: list[str], path) -> dict:
    """main(args + --json path)'s report, checked to be what it wrote."""
    out = main(args + ["--json", str(path)])
    assert json.loads(path.read_text()) == out
    return out


@pytest.fixture(scope="session")
def speed_report(tiny_dir, tmp_path_factory):
    with fake_clock():
        return _written(speed.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32",
                                     "--frames", str(FRAMES), "--repeats", str(REPEATS), "--prompts", "xvector",
                                     "--stacks", "upstream,auto:15,lean:5,nosuch:5", "--agreement", ""],
                        tmp_path_factory.mktemp("speed") / "speed.json")


@pytest.fixture(scope="session")
def batch_report(tiny_dir, tmp_path_factory):
    with fake_clock():
        return _written(batch.main, ["--model", str(tiny_dir), "--device", "cpu", "--dtype", "fp32",
                                     "--lines", str(LINES), "--frames", str(LINE_FRAMES), "--warm-frames", "2",
                                     "--batch-sizes", "2", "--seq-groups", "5", "--modes", "auto,nosuch"],
                        tmp_path_factory.mktemp("batch") / "batch.json")


@pytest.fixture(scope="session")
def first_call_report(tiny_dir, tmp_path_factory):
    return _written(speed.main, ["--first-call", "auto", "--model", str(tiny_dir), "--device", "cpu", "--dtype",
                                 "fp32", "--frames", str(FIRST_CALL_FRAMES), "--prompts", "xvector"],
                    tmp_path_factory.mktemp("first_call") / "first_call.json")
