"""Long text is split at sentence boundaries; nothing is lost or reordered."""

from hypothesis import given, settings, strategies as st

from morph.lines.text_split import split_text


def test_sentences_are_packed_whole():
    text = "One sentence. Another one! A question? " * 30
    segments = split_text(text, 100)
    assert all(len(s) <= 100 for s in segments)
    assert all(s.endswith((".", "!", "?")) for s in segments)


def test_cjk_sentences_join_without_spaces():
    assert split_text("你好。我很好！", 50) == ["你好。我很好！"]


def test_an_overlong_sentence_breaks_at_clauses_then_spaces():
    text = "first clause, " + "word " * 60 + "end."
    segments = split_text(text, 80)
    assert segments[0] == "first clause,"
    assert all(0 < len(s) <= 80 for s in segments)


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=0, max_size=600), st.integers(min_value=5, max_value=200))
def test_split_keeps_every_character_in_order(text, max_chars):
    segments = split_text(text, max_chars)
    assert all(0 < len(s) <= max_chars for s in segments)
    assert "".join("".join(segments).split()) == "".join(text.split())
