"""morph/prompts.py: a prompt's tokens are counted as the loaded model's tokenizer splits them, and the count bounds
the prompt upstream builds (the cache is sized from it); what the talker prefills for a voice's row is bounded by
prefill_tokens, whatever the length of its text (the declared memory of a prefill is counted from it)."""

from __future__ import annotations

from morph.prompts import PROMPT_OVERHEAD_TOKENS, make_rows, prefill_tokens, prompt_inputs, prompt_tokens, token_count
from morph.render import Line
from morph.settings import GenerationSettings


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
        got = tiny_tts.patch.prompt_of(lambda: model.model.generate(
            languages=["English"] * 2, **prompt_inputs(tiny_tts, rows), **kwargs))
        prefilled = got["attention_mask"].sum(-1).tolist()
        assert prefilled[0] == prefilled[1] <= prefill_tokens(texts[1], voice)
        assert prefill_tokens(texts[0], voice) == prefill_tokens(texts[1], voice) < prompt_tokens(texts[1], voice)
    assert prefill_tokens("Hi.", voices["icl"]) - prefill_tokens("Hi.", voices["xvec"]) == len(voices["icl"].ref_code)
