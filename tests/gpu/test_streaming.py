"""Audio as it is made on the GPU (tiny model, fp32, through the public API, in the captured modes): the host learns
a row's frames `sync_lag` frames behind the GPU and the codec runs on its own stream, so chunks come a few frames
later than on the CPU, and still while the row runs; each line's chunks joined are its audio, and a stream, run on
its reader's thread, leaves that thread on its own CUDA stream between chunks and stops its render when closed
early."""

import numpy as np
import pytest
import torch

from bench.workload import eos_held
from morph.codec.calls import FIRST_GRID
from morph.engine.runner import LiveChunks
from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling
from tests.audio_compare import assert_audio_close

FRAME = 1920  # samples a frame at 24 kHz
# A chunk's decode and the whole row's are the same sums in other groupings: on the GPU their convolutions round apart
# by up to 1.5e-4 of the peak (H100, fp32, cuDNN's default algorithms; 1e-5 on the CPU); tests/gpu/test_codec.py
# holds the codec to upstream's decode within the same 2e-3
RTOL = 2e-3


# four lines through three slots (the tests below), each ending at its own frame
TEXTS = ["The longest line of the four, by far.", "A middling line here.", "Short one.", "Late."]
ENDS = [40, 20, 6, 30]


def four_lines(cuda_tts, voices) -> tuple[list[Line], BatchTTS]:
    lines = [Line(text, voices["icl" if i % 2 else "xvector"], "English") for i, text in enumerate(TEXTS)]
    batch = BatchTTS(cuda_tts)
    batch.stop = lambda row: min(row.limit, ENDS[row.index])
    return lines, batch


def settings(frames: int) -> GenerationSettings:
    return GenerationSettings(seq_groups=5, do_sample=True, subtalker=Sampling(do_sample=True), seed=3,
                              max_new_tokens=frames)


@pytest.mark.parametrize("mode", ["graphs", "fused"])
def test_chunks_come_while_rows_run_and_join_to_each_lines_audio(cuda_tts, voices, mode):
    """Four lines through three slots, each ending at its own frame: rows join longest text first, so line 3 (the
    shortest text, 30 frames) joins once line 2 has ended at frame 6 and the host has read it, at the next FIRST_GRID
    mark. Every line's first chunk comes within FIRST_GRID + 2 x sync_lag + 1 frames of its joining (line 3's within
    twice that of line 2's end), long before the line ends,
    and its chunks joined are on_line's audio and the render's without chunks."""
    lines, batch = four_lines(cuda_tts, voices)
    ends = ENDS
    frames, log = [], []
    cuda_tts.patch.mode = mode
    try:
        held = eos_held(settings(48), 48)  # rows end where `ends` says, not at a random weight's EOS
        audio = batch.render(lines, held, batch_size=3, on_chunk=lambda i, wav: log.append((i, len(frames), wav)),
                             on_step=lambda done, total: frames.append(done))
        plain = batch.render(lines, held, batch_size=3)
    finally:
        cuda_tts.patch.mode = "auto"
    assert cuda_tts.patch.last_run["mode"] == mode
    lag = cuda_tts.patch.loop.sync_lag
    first = {i: min(f for j, f, _ in log if j == i) for i in range(4)}
    # a chunk goes to the codec `lag` frames after its last frame was made, behind the frames the host has queued
    # by then (up to `lag` more), and is handed out at the first frame after its copy has landed
    soon = FIRST_GRID + 2 * lag + 1
    assert max(first[0], first[1], first[2]) <= soon, (first, lag)
    # line 3 joins once the host has read line 2's end (lag frames on), at a FIRST_GRID mark, and its first chunk
    # comes while it runs (H100: 21 frames after line 2's end, 2026-11-25)
    assert first[3] - ends[2] <= 2 * soon and first[3] < ends[2] + ends[3], (first, lag)
    for i in range(4):
        assert np.array_equal(np.concatenate([wav for j, _, wav in log if j == i]), audio[i]), i
        assert audio[i].size == ends[i] * FRAME
        assert_audio_close(audio[i], plain[i], rel=RTOL)


@pytest.mark.parametrize("mode", ["graphs", "fused"])
def test_the_codec_beside_the_step_never_changes_a_rows_codes(cuda_tts, voices, mode, monkeypatch):
    """The codec's graphs replay on the codec's stream while the step's replay on the loop's. Captured on one stream,
    they shared cuBLAS's workspace, and one fused render in four of these lines changed two rows' codes (H100,
    2026-11-25; graphs.capture). Twelve renders, streamed and not, half after release_device_state: every row's
    codes are those BatchTTS.codes gives (no codec beside the loop), and its audio is their decode whole. (A race:
    a pass makes it unlikely, not impossible.)"""
    lines, batch = four_lines(cuda_tts, voices)
    got = {}
    end = LiveChunks.end  # each row's codes as it ends, before they go to the codec
    monkeypatch.setattr(LiveChunks, "end", lambda self, row, codes: (
        got.__setitem__(row.index, codes[:ENDS[row.index]].cpu()), end(self, row, codes))[1])
    cuda_tts.patch.mode = mode
    try:
        held = eos_held(settings(48), 48)
        want = [c[:e].cpu() for c, e in zip(batch.codes(lines, held, batch_size=3), ENDS, strict=True)]
        for k in range(12):
            if k == 6:
                cuda_tts.release_device_state()
            got.clear()
            streamed = dict(on_chunk=lambda i, wav: None) if k % 2 else {}
            audio = batch.render(lines, held, batch_size=3, **streamed)
            codes = [got[i] for i in range(len(lines))]
            for i, (c, w) in enumerate(zip(codes, want, strict=True)):
                assert torch.equal(c, w), (k, i, int((c != w).sum()))
            for a, whole in zip(audio, batch.decode(codes, [line.voice for line in lines]), strict=True):
                assert_audio_close(a, whole, rel=RTOL)
    finally:
        cuda_tts.patch.mode = "auto"


def test_a_stream_yields_its_line_and_closing_it_early_stops_the_render(cuda_tts, voices):
    line = Line("Stream this line on the GPU.", voices["xvector"], "English")
    chunks = list(cuda_tts.stream(line.text, line.voice, "English", settings(24)))
    whole = BatchTTS(cuda_tts).render([line], settings(24), batch_size=None)[0]
    assert len(chunks) > 1 and chunks[0].size < whole.size
    assert_audio_close(np.concatenate(chunks), whole, rel=RTOL)

    stream = cuda_tts.stream("A long line the reader leaves after its first chunk.", voices["xvector"], "English",
                             settings(400))
    caller = torch.cuda.current_stream()
    assert next(stream).size <= (FIRST_GRID + cuda_tts.patch.loop.sync_lag) * FRAME
    # the reader's thread ran the frames, on the frame loop's stream in inference mode, and left both before the yield
    assert torch.cuda.current_stream() == caller and not torch.is_inference_mode_enabled()
    stream.close()
    assert torch.cuda.current_stream() == caller
