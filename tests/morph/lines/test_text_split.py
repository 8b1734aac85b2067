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


def test_the_last_sentence_ends_the_last_segment_whatever_its_shape():
    """A long line's tail is the part most easily lost: a short last sentence, one without an end mark, an
    over-long one broken at clauses and one broken at spaces each end the last segment."""
    body = "A first sentence of some length. A second one follows it! "
    for tail in ("End.", "no end mark at all", "last, and long " + "word " * 20 + "done.", "x" * 42 + "end"):
        segments = split_text(body + tail, 40)
        assert segments[-1].endswith(tail[-3:]), (tail, segments)
        assert "".join("".join(segments).split()) == "".join((body + tail).split())


def test_a_sentence_a_clause_or_a_pair_of_exactly_the_limit_stays_whole():
    """At max_chars, not one under. A short sentence in front keeps the packing from gluing broken parts back:
    a sentence of exactly the limit is not broken at its comma, a clause of exactly the limit (in an over-long
    sentence) not at its space, and two sentences that fill the limit with their space are packed together."""
    assert split_text("Hi. Twelve char, then more.", 23) == ["Hi.", "Twelve char, then more."]
    assert split_text("Hi. Aaaa bbbb, cccc dddd.", 10) == ["Hi.", "Aaaa bbbb,", "cccc dddd."]
    assert split_text("One two. Three four.", 20) == ["One two. Three four."]
    assert split_text("One two. Three four.", 19) == ["One two.", "Three four."]


def test_an_overlong_run_breaks_at_its_last_space_before_the_limit_else_hard():
    """Words stay whole where a space allows it (a space at index 1 included); a word longer than the limit is cut."""
    assert split_text("aaa bbb ccc ddd eee", 9) == ["aaa bbb", "ccc ddd", "eee"]
    assert split_text("a bbbbbbbbbbbb", 9) == ["a", "bbbbbbbbb", "bbb"]


def test_an_empty_piece_between_sentences_is_skipped_not_the_end():
    """A CJK end mark right before a line break leaves an empty piece between the two; the text goes on after it."""
    assert split_text("你好。\n再见。", 50) == ["你好。再见。"]
    assert split_text("你好。\n再见。", 3) == ["你好。", "再见。"]
