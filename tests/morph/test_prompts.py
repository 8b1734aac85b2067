"""morph/prompts.py: a prompt's tokens are counted as the loaded model's tokenizer splits them, and the count bounds
the prompt upstream builds (the cache is sized from it)."""

from __future__ import annotations

from morph.prompts import PROMPT_OVERHEAD_TOKENS, prompt_tokens, token_count


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
