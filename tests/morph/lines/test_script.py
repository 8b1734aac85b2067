"""Dialogue script parsing: `Name: text` lines, comments, case-insensitive names, clear errors."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from morph.lines.script import ScriptLine, check_name, name_key, parse_script
from morph.lines.words import FOR_NODES

NAMES = ["Alice", "Bob", "Old Man", "Zoë"]


def test_parses_lines_in_order_skipping_blanks_and_comments():
    script = """
    # Act 1, scene 1
    Alice: Hello there.
      bob :  Hi, Alice! What time is it? 10:30: late.

    OLD  MAN: #not a comment: the text may hold '#' and ':'
    # Alice: this line is a comment
    zoë：Full-width colon works too.
    """
    assert parse_script(script, NAMES) == [
        ScriptLine(3, "Alice", "Hello there."),
        ScriptLine(4, "Bob", "Hi, Alice! What time is it? 10:30: late."),
        ScriptLine(6, "Old Man", "#not a comment: the text may hold '#' and ':'"),
        ScriptLine(8, "Zoë", "Full-width colon works too."),
    ]


def test_unknown_name_lists_the_line_and_the_known_names():
    with pytest.raises(ValueError) as e:
        parse_script("Alice: Hi.\n\nCarol: Who am I?", NAMES)
    message = str(e.value)
    assert "line 3: unknown character 'Carol'" in message
    assert "Known characters: Alice, Bob, Old Man, Zoë; fix the spelling or give the missing character a voice" \
        in message
    with pytest.raises(ValueError, match="fix the spelling or add a Voice Bank node for each missing character$"):
        parse_script("Carol: Who am I?", NAMES, FOR_NODES)


def test_a_line_without_a_name_is_an_error_with_its_number():
    with pytest.raises(ValueError, match=r"line 2 \('just some words'\) does not start with 'Name:'"):
        parse_script("Alice: Hi.\njust some words\n", NAMES)
    with pytest.raises(ValueError, match=r"line 1 \(': no name'\) does not start with 'Name:'"):
        parse_script(": no name", NAMES)


def test_every_problem_is_reported_at_once():
    script = "\n".join(["Alice: fine", "nobody knows", "Eve: hi", "Bob:", "Bob:   "] + ["x"] * 12)
    with pytest.raises(ValueError) as e:
        parse_script(script, NAMES)
    message = str(e.value)
    for expected in ("line 2 ", "line 3: unknown character 'Eve'", "line 4: Bob has nothing to say",
                     "line 5: Bob has nothing to say", "and 6 more"):
        assert expected in message


@pytest.mark.parametrize("script", ["", "   \n\n", "# only a comment\n  # and another"])
def test_a_script_without_lines_is_an_error(script):
    with pytest.raises(ValueError, match="the script has no spoken lines; write one line per spoken line"):
        parse_script(script, NAMES)


def test_names_are_compared_casefolded_with_blanks_collapsed():
    assert name_key("  Old\t MAN ") == "old man" == name_key("old man")
    assert name_key("STRASSE") == name_key("straße")


@pytest.mark.parametrize("bad", ["", "   ", "Dr: Who", "#hash", "x" * 61, "a：b"])
def test_bank_names_that_a_script_could_not_use_are_rejected(bad):
    with pytest.raises(ValueError, match=r"^Voice bank: the character name"):
        check_name(bad)
    assert check_name("  Old   Man ") == "Old Man"


# -- properties ----------------------------------------------------------------------------------
CLEAR = re.compile(r"(line \d+|no spoken lines)")


@settings(max_examples=300, deadline=None)
@given(st.text(), st.lists(st.text(min_size=1, max_size=12), max_size=4))
def test_any_text_either_parses_or_gets_a_clear_error(script, names):
    names = [n for n in names if n.strip() and ":" not in n and "：" not in n]
    try:
        lines = parse_script(script, names)
    except ValueError as e:
        assert CLEAR.search(str(e)), str(e)
        return
    keys = {name_key(n) for n in names}
    numbers = [line.number for line in lines]
    assert numbers == sorted(set(numbers)) and lines
    physical = script.splitlines()
    for line in lines:
        assert name_key(line.name) in keys and line.text == line.text.strip() and line.text
        assert line.text in physical[line.number - 1]


# One physical line of text: no line breaks of any kind str.splitlines knows.
_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
spoken = st.text(st.characters(blacklist_characters=_BREAKS), min_size=1).filter(lambda t: t.strip())
noise = st.sampled_from(["", "   ", "# a comment", "  # Alice: commented out", "\t"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from([str, str.upper, str.lower]), spoken, noise),
                min_size=1, max_size=20))
def test_well_formed_scripts_keep_order_names_and_text(entries):
    rows = []
    for name, case, text, filler in entries:
        rows += [filler, f"{case(name)}: {text}"]
    parsed = parse_script("\n".join(rows), NAMES)
    assert [(p.name, p.text) for p in parsed] == [(name, text.strip()) for name, _, text, _ in entries]
    assert [p.number for p in parsed] == list(range(2, 2 * len(entries) + 1, 2))


def test_a_name_of_the_longest_length_is_kept_and_one_more_is_refused_with_its_start():
    assert check_name("n" * 60) == "n" * 60
    with pytest.raises(ValueError, match=r"^Voice bank: the character name 'aaaaaaaaaabbbbbbbbbb'\.\.\. is 61 characters; "
                                         r"use at most 60$"):
        check_name("a" * 10 + "b" * 10 + "c" * 41)
    with pytest.raises(ValueError, match=r"^Voice bank: the character name 'A: B' cannot hold ':' or start with '#' "
                                         r"\(scripts are written 'Name: text'\); choose a name without them$"):
        check_name("A: B")
