"""morph/prompts.py: a prompt's tokens are counted as the loaded model's tokenizer splits them, and the count bounds
the prompt upstream builds (the cache is sized from it); what the talker prefills for a voice's row is bounded by
prefill_tokens, whatever the length of its text (the declared memory of a prefill is counted from it); a group's prompt
as the continuous batch builds it (morph/engine/runner.py RowRunner._group), from the rows together or
from each row's prompt built alone beforehand with a private tokenizer (a server's), gives, bit for bit, the
prompt and options upstream's generate_voice_clone, generate_custom_voice and generate_voice_design hand the talker
for the same lines, in every variant: x-vector and ICL voices, built-in speakers (a dialect speaker in Chinese and
Auto among them), instructs and none; rows of several lengths, so the left padding and the trailing text's tts_pad
are in it."""

from __future__ import annotations

import pytest
import torch

from morph.engine.runner import RowRunner, prompts_aside
from morph.prompts import (PROMPT_OVERHEAD_TOKENS, PrivateTokenizer, batch_inputs, make_rows, prefill_tokens, prompt_inputs,
                           prompt_tokens, row_prompts, token_count, voice_prefill_lengths)
from morph.render import Line
from morph.settings import GenerationSettings, Sampling


def test_a_prompt_is_counted_in_the_models_tokens_and_bounds_the_real_prompt(tiny_tts):
    count = token_count(tiny_tts)
    text = "A sentence of some length, spoken by one of the characters in the script."
    assert 0 < count(text) < len(text) / 3  # English runs about four characters a token
    assert count("") == 0
    assert prompt_tokens(text, None, "", count) == count(text) + PROMPT_OVERHEAD_TOKENS
    model = tiny_tts.tts
    built = model._tokenize_texts([model._build_assistant_text(text)])[0].shape[-1]  # what upstream embeds
    assert built <= prompt_tokens(text, None, "", count)
    assert prompt_tokens(text) == len(text) + PROMPT_OVERHEAD_TOKENS  # without a tokenizer: one per character


def test_a_voices_prefill_lengths_are_those_its_rows_prefill_in_any_language_within_the_bound(tiny_tts, voices,
                                                                                             monkeypatch):
    """voice_prefill_lengths, measured once a voice (MorphTTS readies its prefill buckets by them): each row of the
    voice, joining alone, prefills one of them, whatever its text and language, and prefill_tokens bounds them."""
    from morph.decode.prefill_graphs import PrefillGraphs
    from morph.render import BatchTTS

    met = []
    real = PrefillGraphs.prefill
    monkeypatch.setattr(PrefillGraphs, "prefill", lambda self, loop, embeds, mask, *a, **k: (
        met.append(mask.shape), real(self, loop, embeds, mask, *a, **k))[1])
    monkeypatch.setattr(tiny_tts.patch, "mode", "lean")  # the continuous batch, whose joins prefill a slice each
    for voice in voices.values():
        met.clear()
        lines = [Line(text, voice, language) for text in ("Hi.", "A much longer line, " * 6)
                 for language in ("Auto", "English", "Chinese")]
        BatchTTS(tiny_tts).render(lines, GenerationSettings(max_new_tokens=2), batch_size=1)
        lengths = voice_prefill_lengths(tiny_tts, voice)
        assert {length for rows, length in met} == lengths and len(lengths) == 2 and {rows for rows, _ in met} == {1}
        assert max(lengths) <= prefill_tokens("", voice) and max(lengths) - min(lengths) == 1


def test_a_private_tokenizer_counts_as_the_models_on_many_threads_and_keeps_a_bounded_cache(tiny_tts, monkeypatch):
    import concurrent.futures

    monkeypatch.setattr(PrivateTokenizer, "COUNTS_KEPT", 3)
    private, count = PrivateTokenizer(tiny_tts), token_count(tiny_tts)
    texts = [f"Line number {i} of a script, read by one of its characters." for i in range(40)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # a fast tokenizer alone says "Already borrowed"
        assert list(pool.map(private.count, texts * 4)) == [count(t) for t in texts] * 4
    assert private._count.cache_info().currsize == 3


def test_without_a_tokenizer_a_text_counts_a_token_a_character():
    import types

    no_processor = types.SimpleNamespace(tts=types.SimpleNamespace(device=torch.device("cpu")))
    no_tokenizer = types.SimpleNamespace(tts=types.SimpleNamespace(device=torch.device("cpu"),
                                                                   processor=types.SimpleNamespace()))
    for tts in (no_processor, no_tokenizer):
        assert token_count(tts)("Hello there.") == PrivateTokenizer(tts).count("Hello there.") == 12


def test_a_voices_prefill_is_its_markup_and_reference_whatever_its_text(tiny_tts, voices):
    """Upstream reads a voice's text beside its codes: the prompt the talker prefills (its attention mask) stays
    within prefill_tokens for a short and a long text, x-vector and ICL alike, and an ICL voice's reference adds to
    it."""
    model, settings = tiny_tts.tts, GenerationSettings()
    texts = ["Hi.", "A much longer line of text, " * 8 + "which the talker reads a token a frame."]
    for voice in voices.values():
        lines = [Line(t, voice, "English") for t in texts]
        rows = make_rows(tiny_tts, lines, settings, "test", True)
        kwargs = model._merge_generate_kwargs(**settings.upstream_kwargs(rows[1].text))
        got = batch_inputs(model.model, row_prompts(model.model, ["English"] * 2, **prompt_inputs(tiny_tts, rows)),
                           min_new_tokens=settings.min_new_tokens, **kwargs)
        prefilled = got["attention_mask"].sum(-1).tolist()
        assert prefilled[0] == prefilled[1] <= prefill_tokens(texts[1], voice)
        assert prefill_tokens(texts[0], voice) == prefill_tokens(texts[1], voice) < prompt_tokens(texts[1], voice)
    assert prefill_tokens("Hi.", voices["icl"]) - prefill_tokens("Hi.", voices["xvec"]) == len(voices["icl"].ref_code)


# the first row is not the longest: a batch's width is its first row's prompt and left padding (morph.prompts)
TEXTS = ["A short one.", "The second line of the batch, and the longest of the four.", "Number three.", "Four."]
LANGUAGES = ["English", "Auto", "German", "Chinese"]
# sampled options other than upstream's defaults, so the options are checked, not just their defaults
SETTINGS = GenerationSettings(temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.1,
                              subtalker=Sampling(temperature=0.6, top_k=30, top_p=0.8), max_new_tokens=40)


class _Reached(Exception):
    """Upstream's generate got to the talker."""


def upstream(tts, monkeypatch, generate_name: str, **inputs) -> dict:
    """What upstream's generate_* hands talker.generate for these inputs (output switches aside)."""
    seen = {}

    def talker_generate(**kwargs):
        seen.update(kwargs)
        raise _Reached

    monkeypatch.setattr(tts.tts.model.talker, "generate", talker_generate)
    with pytest.raises(_Reached):
        getattr(tts.tts, generate_name)(text=TEXTS, language=LANGUAGES, **inputs,
                                        **SETTINGS.upstream_kwargs(max(TEXTS, key=len)))
    monkeypatch.undo()
    assert seen.pop("output_hidden_states") and seen.pop("return_dict_in_generate")
    return seen


def ours(tts, lines: list[Line], aside: bool) -> dict:
    """aside: each row's prompt built alone, with a private tokenizer, before the group (as LiveEngine.submit does)."""
    rows = make_rows(tts, lines, SETTINGS, "test", False)
    if aside:
        tokenize = PrivateTokenizer(tts).tokenize
        rows = [built for r in rows for built in prompts_aside(tts, [r], tokenize)]
        assert all(r.prompt is not None for r in rows)
    got, group = RowRunner(tts, SETTINGS, len(rows), 0, 0, lambda r: r.limit, lambda row, audio: None)._group(
        [(r, 0) for r in rows])
    assert all(group.prompt[k] is got[k] for k in group.prompt)
    return got


def assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and got[key].device == value.device, key
            assert got[key].shape == value.shape and torch.equal(got[key], value), key
        else:
            assert got[key] == value, key
    assert len(set(want["attention_mask"].sum(-1).tolist())) > 1  # rows of several lengths: some left-padded


@pytest.mark.parametrize("aside", [False, True], ids=["group", "rows-aside"])
def test_voices_prompt_is_upstreams(tiny_tts, voices, monkeypatch, aside):
    """x-vector and ICL voices mixed in one batch (generate_voice_clone, streaming)."""
    picked = [voices["xvec"], voices["icl"], voices["xvec"], voices["icl"]]
    want = upstream(tiny_tts, monkeypatch, "generate_voice_clone",
                    voice_clone_prompt=[tiny_tts._prompt_item(v) for v in picked])
    assert want["trailing_text_hidden"].shape[1] > 1
    assert_same(ours(tiny_tts, [Line(t, v, lang) for t, v, lang in zip(TEXTS, picked, LANGUAGES, strict=True)],
                     aside), want)


@pytest.mark.parametrize("aside", [False, True], ids=["group", "rows-aside"])
@pytest.mark.parametrize("variant", ["custom_voice", "voice_design"])
def test_speakers_and_instructs_prompt_is_upstreams(model_dirs, monkeypatch, variant, aside):
    """Built-in speakers (eric speaks a dialect in Chinese and Auto) and instructs (one empty): the whole text in the
    prompt (non-streaming), the trailing text tts_pad alone."""
    from morph.api import MorphTTS

    tts = MorphTTS.load(str(model_dirs("tiny", variant)), device="cpu", dtype="fp32", attention="sdpa")
    if variant == "custom_voice":
        speakers = ["Vivian", "Eric", "Ryan", "Eric"]
        want = upstream(tts, monkeypatch, "generate_custom_voice", speaker=speakers)
        lines = [Line(t, language=lang, speaker=s) for t, lang, s in zip(TEXTS, LANGUAGES, speakers, strict=True)]
    else:
        instructs = ["A warm, low voice.", "", "Bright and quick.", "Slow."]
        want = upstream(tts, monkeypatch, "generate_voice_design", instruct=instructs)
        lines = [Line(t, language=lang, instruct=i) for t, lang, i in zip(TEXTS, LANGUAGES, instructs, strict=True)]
    assert want["trailing_text_hidden"].shape[1] == 1
    assert_same(ours(tts, lines, aside), want)
