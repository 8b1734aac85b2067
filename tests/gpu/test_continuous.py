"""The continuous batch on the GPU (fp32, through the public API): the fast modes give the op-by-op codes with
per-row streams, rows give their single-line take, and memory stays flat render after render."""

import logging

import pytest
import torch

from morph.render import BatchTTS, Line
from morph.settings import GenerationSettings, Sampling

TEXTS = ["The first line, and the longest of the six in this batch.", "A short one.", "Number three here.",
         "And the fourth.", "Five is a little longer than four.", "Six."]


def settings(k: int, seed=7, frames=24) -> GenerationSettings:
    return GenerationSettings(seq_groups=k, do_sample=True, subtalker=Sampling(do_sample=True), seed=seed,
                              max_new_tokens=frames)


def codes(tts, mode: str, k: int, voice, texts, width: int) -> list[torch.Tensor]:
    tts.patch.mode = mode
    try:
        lines = [Line(text, voice, "English") for text in texts]
        return [c.cpu() for c in BatchTTS(tts).codes(lines, settings(k), batch_size=width)]
    finally:
        tts.patch.mode = "auto"


@pytest.mark.parametrize("mode", ["graphs", "fused"])
@pytest.mark.parametrize("prompt", ["xvector", "icl"])
@pytest.mark.parametrize("k", [15, 5])
def test_continuous_fast_mode_equals_op_by_op(cuda_tts, voices, mode, prompt, k):
    """Six seeded lines through four slots: rows join as others end, in a captured step."""
    fast = codes(cuda_tts, mode, k, voices[prompt], TEXTS, 4)
    assert cuda_tts.patch.last_run["mode"] == mode and cuda_tts.patch.last_run["rows"] == 6
    lean = codes(cuda_tts, "lean", k, voices[prompt], TEXTS, 4)
    assert all(c.shape[0] > 3 for c in fast)
    assert all(torch.equal(a, b) for a, b in zip(fast, lean, strict=True))
    alone = codes(cuda_tts, mode, k, voices[prompt], TEXTS[2:3], 1)[0]
    assert torch.equal(alone, fast[2])  # its own stream: the same take alone


def test_twenty_continuous_renders_do_not_grow_allocated_memory(cuda_tts, voices):
    cuda_tts.patch.mode = "graphs"
    try:
        after = []
        for i in range(20):
            BatchTTS(cuda_tts).render([Line(t, voices["icl"], "English") for t in TEXTS[:3]], settings(5, seed=i, frames=20),
                                      batch_size=2)
            torch.cuda.synchronize()
            after.append(torch.cuda.memory_allocated())
    finally:
        cuda_tts.patch.mode = "auto"
    assert max(after[1:]) - after[0] <= 1 << 20, after


@pytest.mark.parametrize("mode", ["graphs", "fused"])
def test_a_render_outside_inference_mode_captures_its_steps(cuda_tts, voices, mode, caplog):
    """A render outside inference mode after one inside it (as the public API is called beside bench code or a
    host's nodes) captures its new widths' steps: the capture failed on what the first call cached and ran op by
    op, several times slower, with only a warning."""
    lines = [Line(t, voices["xvector"], "English") for t in TEXTS[:3]]
    cuda_tts.patch.mode = mode
    cuda_tts.release_device_state()  # a kept wider state (an earlier test's) would serve the wider render as it is
    try:
        with torch.inference_mode():
            BatchTTS(cuda_tts).codes(lines[:1], settings(5, frames=8), batch_size=1)
        graphs = len(cuda_tts.patch.loop.graphs)
        with caplog.at_level(logging.WARNING):
            BatchTTS(cuda_tts).render(lines, settings(5, frames=40), batch_size=3)
    finally:
        cuda_tts.patch.mode = "auto"
    assert not [r.getMessage() for r in caplog.records if "could not prepare" in r.getMessage()]
    assert len(cuda_tts.patch.loop.graphs) > graphs  # the wider steps were captured, not run op by op


@pytest.mark.parametrize("frames", [1, 6])
def test_no_frame_is_stepped_past_every_rows_frame_limit(cuda_tts, voices, frames):
    """Rows held to their frame limit (a one-frame clone's, a benchmark's fixed lengths): the host knows that they end
    there, so the batch steps no frame past it. It used to step the sync_lag frames it reads the GPU's flags behind
    by: 4 of the 5 steps of a warm one-frame clone."""
    from bench.workload import eos_held

    lines = [Line(text, voices["xvector"], "English") for text in TEXTS[:3]]
    cuda_tts.patch.mode = "fused"
    try:
        got = BatchTTS(cuda_tts).codes(lines, eos_held(settings(5, frames=frames), frames), batch_size=4)
    finally:
        cuda_tts.patch.mode = "auto"
    assert [c.shape[0] for c in got] == [frames] * len(lines)
    assert cuda_tts.patch.last_run["frames_run"] == frames, cuda_tts.patch.last_run


@pytest.mark.parametrize("mode", ["graphs", "fused"])
def test_a_row_left_alone_in_64_slots_steps_alone(cuda_tts, voices, mode):
    """64 seeded lines through 64 slots, all but one ending within 6 frames. The one left has the shortest text,
    so it joined into the top slot: it is moved down as the others end and runs its last frames in the one-row
    step (its own graph), with the take it draws alone; every row's codes are the op-by-op codes."""
    from bench.workload import eos_held

    lines = [Line(f"Line {i} of the sixty-four in this batch.", voices["xvector"], "English") for i in range(63)]
    lines.append(Line("Six.", voices["xvector"], "English"))
    ends = {line.text: 3 + i % 4 for i, line in enumerate(lines)}
    ends["Six."] = 40
    batch = BatchTTS(cuda_tts)
    batch.stop = lambda row: min(row.limit, ends[row.text])

    def run(mode: str, chosen: list) -> list[torch.Tensor]:
        cuda_tts.patch.mode = mode
        try:
            # rows end where `ends` says, not at a random weight's EOS
            return [c.cpu() for c in batch.codes(chosen, eos_held(settings(5, frames=48), 48), batch_size=64)]
        finally:
            cuda_tts.patch.mode = "auto"

    fast = run(mode, lines)
    widths = cuda_tts.patch.last_run["widths"]
    assert cuda_tts.patch.last_run["mode"] == mode and widths[1] >= 25, cuda_tts.patch.last_run
    assert [c.shape[0] for c in fast] == [ends[line.text] for line in lines]
    assert torch.equal(run(mode, lines[-1:])[0], fast[-1])  # alone, in a batch of one
    if mode == "graphs":  # the lean ops, captured; fused's kernels round apart from them, and over 64 sampled rows
        # a draw flips (its take alone, above, is the check that the moved row kept its state)
        assert all(torch.equal(a, b) for a, b in zip(fast, run("lean", lines), strict=True))


def test_a_joins_index_copies_do_not_wait_for_the_frames_queued_ahead():
    """morph/decode/kv_store.py to_device: behind about a second of queued GPU work the copy is queued too, where a
    copy from pageable memory waits for the queue; the values arrive all the same."""
    from morph.decode.kv_store import to_device

    def queued_behind_work(copy) -> tuple[bool, torch.Tensor]:
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)  # clock cycles: about a second
        got = copy([3, 1, 2])
        behind = torch.cuda.Event()
        behind.record()
        waited = behind.query()  # the host waited for the queue only if the work ahead is done already
        torch.cuda.synchronize()
        return waited, got

    waited, got = queued_behind_work(lambda v: to_device(v, "cuda"))
    assert not waited and got.tolist() == [3, 1, 2] and got.dtype == torch.long
    waited, _ = queued_behind_work(lambda v: torch.tensor(v, device="cuda"))
    assert waited  # what the joins did before


def test_the_frame_loop_runs_on_the_highest_priority_stream_and_hands_the_callers_back(cuda_tts, voices, monkeypatch):
    """morph/graphs.py frame_loop_stream: each frame's step runs on the pack's stream of the device's highest priority,
    above the codec's, and the caller's stream is current again between frames (its on_step runs there) and after,
    ordered behind the loop's work."""
    from morph.engine.batch import ContinuousBatch

    caller, stepped, reported = torch.cuda.current_stream(), [], []
    step = ContinuousBatch._step

    def watched(self, finished):
        stepped.append(torch.cuda.current_stream())
        return step(self, finished)

    monkeypatch.setattr(ContinuousBatch, "_step", watched)
    out = BatchTTS(cuda_tts).render([Line(t, voices["xvector"], "English") for t in TEXTS[:3]],
                                    settings(5, frames=12), batch_size=2,
                                    on_step=lambda done, total: reported.append(torch.cuda.current_stream()))
    highest = torch.cuda.Stream.priority_range()[1]
    assert stepped and all(s != caller and s.priority == highest for s in stepped)
    assert reported and all(s == caller for s in reported)
    assert cuda_tts.codec.side_stream(cuda_tts.device).priority > highest
    assert torch.cuda.current_stream() == caller
    assert all(a.size for a in out)
