"""morph/lines/words.py: each front end's fixes in its own words, and model sizes as users write them."""

from __future__ import annotations

import dataclasses

from morph.lines.words import FOR_CLI, FOR_NODES, FOR_PYTHON, model_size_name

NODE_NAMES = ("node", "Voice prompt", "Voice Bank", "Save Voice", "connect", "filename_prefix", "x_vector_only")


def test_the_cli_never_names_a_node_and_the_nodes_never_name_a_flag():
    for field in dataclasses.fields(FOR_CLI):
        cli, node = getattr(FOR_CLI, field.name), getattr(FOR_NODES, field.name)
        assert not any(name in cli for name in NODE_NAMES), (field.name, cli)
        assert "--" not in node and "cli.py" not in node, (field.name, node)
        assert cli != node != getattr(FOR_PYTHON, field.name), field.name


def test_the_cli_says_how_to_make_a_voice_with_its_own_command():
    assert "cli.py voice save" in FOR_CLI.make_voice and FOR_CLI.prefix == "--prefix" and FOR_CLI.transcript == \
        "--transcript"


def test_model_sizes_read_as_users_write_them():
    assert [model_size_name(s) for s in ("0b6", "1B7", "", "2b")] == ["0.6B", "1.7B", "unknown", "2b"]
