"""The Python API on a tiny model: audio out, host callbacks, bounds and clear errors."""

import numpy as np
import pytest
import torch

from morph.settings import GenerationSettings, Sampling, default_max_frames
from tests.audio_compare import assert_audio_close

GREEDY = GenerationSettings(seq_groups=5, do_sample=False, subtalker=Sampling(do_sample=False), max_new_tokens=12)


def test_clone_returns_24k_float_audio(tiny_tts, ref_audio):
    voice = tiny_tts.make_voice(*ref_audio, transcript="A short reference sentence.")
    audio = tiny_tts.clone("Hello there.", voice, "English", GREEDY)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert audio.size > 0 and audio.size % 1920 == 0  # whole 80 ms frames at 24 kHz
    assert np.isfinite(audio).all()


def test_seeded_runs_repeat_and_seq_groups_changes_per_call(tiny_tts, ref_audio):
    voice = tiny_tts.make_voice(*ref_audio)
    sampled = GenerationSettings(seq_groups=3, seed=5, max_new_tokens=10)
    a = tiny_tts.clone("Same seed, same audio.", voice, settings=sampled)
    b = tiny_tts.clone("Same seed, same audio.", voice, settings=sampled)
    assert np.array_equal(a, b)
    assert tiny_tts.patch.last_run["seq_groups"] == 3
    tiny_tts.clone("Now exact.", voice, settings=GenerationSettings(seq_groups=15, seed=5, max_new_tokens=4))
    assert tiny_tts.patch.last_run["seq_groups"] == 15
    assert tiny_tts.patch.seq_groups == 5  # a call's seq_groups went with the call: the patch keeps its default


def test_on_step_reports_every_frame(tiny_tts, ref_audio):
    voice = tiny_tts.make_voice(*ref_audio)
    steps = []
    audio = tiny_tts.clone("Count the steps.", voice, settings=GREEDY, on_step=lambda i, n: steps.append((i, n)))
    frames = audio.size // 1920
    done = [i for i, _ in steps]
    assert done[:-1] == list(range(1, len(done))), "one report a frame"
    assert done[-1] == 12, "the last report says the render is done, though EOS may end it sooner"
    assert {n for _, n in steps} == {12}  # max_new_tokens 12: at most 12 frames
    assert len(steps) >= frames


class Cancelled(Exception):
    pass


def test_cancel_in_on_step_propagates_and_the_next_run_is_clean(tiny_tts, ref_audio):
    voice = tiny_tts.make_voice(*ref_audio)
    clean = tiny_tts.clone("After a cancel.", voice, settings=GREEDY)

    def cancel_at_3(i, n):
        if i == 3:
            raise Cancelled

    with pytest.raises(Cancelled):
        tiny_tts.clone("This run is cancelled.", voice, settings=GREEDY, on_step=cancel_at_3)
    assert np.array_equal(tiny_tts.clone("After a cancel.", voice, settings=GREEDY), clean)


def test_missed_eos_is_bounded_by_the_text_derived_limit(tiny_tts, ref_audio):
    """A model that never emits EOS stops at default_max_frames(text), not after minutes."""
    from .test_render import talker_logits

    voice = tiny_tts.make_voice(*ref_audio)
    text = "Hi."
    with talker_logits(never_eos=True):
        audio = tiny_tts.clone(text, voice, settings=GenerationSettings(do_sample=False,
                                                                        subtalker=Sampling(do_sample=False)))
    frames = audio.size // 1920
    assert frames == default_max_frames(text)
    assert default_max_frames(text) < 100


def test_default_limit_grows_with_text_but_stays_bounded():
    assert default_max_frames("Hi.") < default_max_frames("Hi. " * 50) < 12.5 * 60 * 10
    assert default_max_frames("x" * 5000) == int(np.ceil(12.5 * (5 + 0.35 * 5000)))


@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_empty_text_is_a_clear_error(tiny_tts, ref_audio, text):
    voice = tiny_tts.make_voice(*ref_audio)
    with pytest.raises(ValueError, match="^Generate: text is empty; type the words to speak"):
        tiny_tts.clone(text, voice, who="Generate")


def test_unknown_language_and_bad_settings_are_clear_errors(tiny_tts, ref_audio):
    voice = tiny_tts.make_voice(*ref_audio)
    with pytest.raises(ValueError, match="language 'Klingon' is not supported.*English"):
        tiny_tts.clone("Hello.", voice, "Klingon")
    with pytest.raises(ValueError, match="seq_groups must be an integer from 1 to 15"):
        tiny_tts.clone("Hello.", voice, settings=GenerationSettings(seq_groups=0))
    with pytest.raises(ValueError, match="top_p"):
        tiny_tts.clone("Hello.", voice, settings=GenerationSettings(top_p=2.0))
    with pytest.raises(ValueError, match="code predictor.*temperature"):
        tiny_tts.clone("Hello.", voice, settings=GenerationSettings(subtalker=Sampling(temperature=-1)))


def test_wrong_variant_names_the_variant_needed(tiny_tts, ref_audio):
    with pytest.raises(ValueError, match="needs a CustomVoice model.*Base.*Qwen3-TTS-12Hz-0.6B-CustomVoice"):
        tiny_tts.custom_voice("Hello.", "vivian", who="Generate (CustomVoice)")
    with pytest.raises(ValueError, match="needs a VoiceDesign model"):
        tiny_tts.voice_design("Hello.", "A calm voice.")
    with pytest.raises(ValueError, match="^Generate: no voice given"):
        tiny_tts.clone("Hello.", None)


def test_custom_voice_and_voice_design_variants(model_dirs):
    from morph.api import MorphTTS

    cv = MorphTTS.load(str(model_dirs("tiny", "custom_voice")), device="cpu", dtype="fp32")
    assert "vivian" in cv.speakers
    assert cv.custom_voice("Hello.", "Vivian", settings=GREEDY).size > 0
    with pytest.raises(ValueError, match=r"^Generate \(CustomVoice\): unknown speaker 'nobody'; this model has .*vi"):
        cv.custom_voice("Hello.", "nobody")
    with pytest.raises(ValueError, match="needs a Base"):
        cv.make_voice(np.ones(24000, np.float32), 24000)
    vd = MorphTTS.load(str(model_dirs("tiny", "voice_design")), device="cpu", dtype="fp32")
    assert vd.voice_design("Hello.", "A warm, low voice.", settings=GREEDY).size > 0


def test_without_transcript_the_voice_is_xvector_only(tiny_tts, ref_audio, caplog):
    import logging

    caplog.set_level(logging.INFO)
    voice = tiny_tts.make_voice(*ref_audio, transcript="   ")
    assert not voice.icl and voice.ref_text is None
    assert "x-vector-only" in caplog.text
    icl = tiny_tts.make_voice(*ref_audio, transcript="Words.")
    assert icl.icl and icl.ref_code.shape[1] == 16 and icl.ref_code.dtype == torch.int64


def test_an_icl_voice_made_where_graphs_replay_has_its_reference_decoded_before_its_first_render(
        tiny_tts, ref_audio, monkeypatch):
    """Where graphs replay (a GPU's fast modes) make_voice primes the codec with an ICL voice's reference, so its first
    render does not; an x-vector voice has none, and off the fast modes nothing is primed."""
    import morph.api

    tiny_tts.codec.release()
    tiny_tts.make_voice(*ref_audio, transcript="A short reference sentence.")
    assert not tiny_tts.codec._primed  # the CPU: nothing captured, nothing made ahead
    monkeypatch.setattr(morph.api, "replays_graphs", lambda tts: True)
    tiny_tts.make_voice(*ref_audio)
    assert not tiny_tts.codec._primed
    voice = tiny_tts.make_voice(*ref_audio, transcript="A short reference sentence.")
    assert len(tiny_tts.codec._primed) == 1
    primed = tiny_tts.codec.primed(voice.ref_code, tiny_tts.device)
    assert list(tiny_tts.codec._primed.values()) == [primed]
    tiny_tts.codec.release()


def test_long_text_is_split_into_the_rows_of_one_batch_and_joined(tiny_tts, ref_audio, monkeypatch):
    from morph.lines.text_split import MAX_SEGMENT_CHARS

    voice = tiny_tts.make_voice(*ref_audio)
    text = " ".join(f"This is sentence number {i} of a very long chapter." for i in range(120))
    assert len(text) > 5000
    model, texts, calls, steps = tiny_tts.tts, [], [], []
    build, generate = model._build_assistant_text, model.model.generate

    def spy_build(segment):
        texts.append(segment)
        return build(segment)

    def spy_generate(**kwargs):
        calls.append(kwargs)
        return generate(**kwargs)

    monkeypatch.setattr(model, "_build_assistant_text", spy_build)
    monkeypatch.setattr(model.model, "generate", spy_generate)
    settings = GenerationSettings(seed=4, max_new_tokens=3)
    audio = tiny_tts.clone(text, voice, settings=settings, on_step=lambda i, n: steps.append(n))
    assert len(calls) == 1 and len(calls[0]["input_ids"]) == len(texts) > 10  # one generate, a row per segment
    assert all(len(t) <= MAX_SEGMENT_CHARS for t in texts)
    assert " ".join(sorted(texts, key=text.index)) == text
    embeddings = calls[0]["voice_clone_prompt"]["ref_spk_embedding"]
    assert all(torch.equal(e, embeddings[0]) for e in embeddings)  # the same voice prompt throughout
    assert set(steps) == {3 * len(texts)}  # max_new_tokens 3: 3 frames for each row
    assert audio.size >= 0.2 * 24000 * (len(texts) - 1)  # pauses between the segments
    with pytest.raises(ValueError, match="^Generate: the text is .* over the 500-character limit of one segment; "
                                         "turn on split_long_text"):
        tiny_tts.clone(text, voice, settings=settings, split_long_text=False, who="Generate")


def test_swapped_or_implausible_transcripts_are_warned_about(tiny_tts, ref_audio, caplog):
    voice = tiny_tts.make_voice(*ref_audio, transcript="Words of the reference clip.")
    tiny_tts.clone("words of the  reference clip.", voice, settings=GREEDY)
    assert "same as the voice's transcript" in caplog.text
    tiny_tts.make_voice(*ref_audio, transcript="A transcript far too long for two seconds of audio. " * 3)
    assert "more than anyone says in that time" in caplog.text


def _rss_bytes():
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_hundred_generations_do_not_grow_memory(tiny_tts, ref_audio):
    import gc

    voice = tiny_tts.make_voice(*ref_audio)
    settings = GenerationSettings(seed=0, max_new_tokens=3)
    for _ in range(10):
        tiny_tts.clone("Warm up.", voice, settings=settings)
    gc.collect()
    before = _rss_bytes()
    for i in range(100):
        tiny_tts.clone("Again and again.", voice, settings=GenerationSettings(seq_groups=1 + i % 15, seed=i,
                                                                                max_new_tokens=3))
    gc.collect()
    assert _rss_bytes() - before < 64 * 2**20


def test_mode_survives_upstream_and_device_state_can_be_released(tiny_tts, ref_audio):
    voice = tiny_tts.make_voice(*ref_audio)
    before = tiny_tts.clone("Release and rebuild.", voice, settings=GREEDY)
    tiny_tts.patch.mode = "lean"
    try:
        with tiny_tts.upstream():
            pass
        assert tiny_tts.patch.mode == "lean"
        lean = tiny_tts.clone("Release and rebuild.", voice, settings=GREEDY)
        assert tiny_tts.patch.last_run["mode"] == "lean"
    finally:
        tiny_tts.patch.mode = "auto"
    tiny_tts.release_device_state()
    assert np.array_equal(tiny_tts.clone("Release and rebuild.", voice, settings=GREEDY), before)
    # the lean loop gives the eager path's codes on CPU fp32, and the lean codec upstream's audio to rounding
    assert_audio_close(lean, before, rel=1e-5)


def test_gpu_out_of_memory_becomes_a_clear_error(tiny_tts, ref_audio, monkeypatch):
    """An out-of-memory error from the decode seam (talker.generate, which the morph patch answers)
    reaches the front end through upstream's generate; one row that does not fit is a clear error."""
    voice = tiny_tts.make_voice(*ref_audio)

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(tiny_tts.tts.model.talker, "generate", oom)
    with pytest.raises(RuntimeError, match=r"^Generate: the GPU ran out of memory rendering a single row "
                                           r"\(6 characters, .*Tried to allocate.*set max_new_tokens lower"):
        tiny_tts.clone("Hello.", voice, who="Generate")
