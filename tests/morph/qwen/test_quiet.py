"""morph.qwen.quiet: only the known third-party messages are dropped."""

import logging
import warnings

import pytest

from morph.qwen.quiet import no_loading_bars, quiet_third_party


def test_quiet_drops_only_the_known_messages(capsys, caplog):
    other = logging.getLogger("transformers.some_module")
    with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_third_party():
            print("\n********\nWarning: flash-attn is not installed. Will only run the manual PyTorch version.\n****")
            print("[ERROR] `cache_position` is part of X.forward's signature, but not documented. Make sure")
            print("a real message")
            logging.getLogger("sox").warning("SoX could not be found!")
            other.warning("The `check_model_inputs` decorator is deprecated in favor of x")
            other.warning("a real warning")
            warnings.warn("`rope_scaling` is deprecated and will be removed", FutureWarning)
            warnings.warn("a real FutureWarning", FutureWarning)
    assert capsys.readouterr().out == "a real message\n"
    assert [r.getMessage() for r in caplog.records] == ["a real warning"]
    assert [str(w.message) for w in seen] == ["a real FutureWarning"]


@pytest.mark.parametrize("bars, hub_bars", [(True, True), (False, False), (True, False)])
def test_loading_bars_are_off_inside_the_block_and_as_they_were_after(bars, hub_bars):
    from huggingface_hub import utils as hub
    from transformers.utils import logging as transformers_logging

    (transformers_logging.enable_progress_bar if bars else transformers_logging.disable_progress_bar)()
    (hub.enable_progress_bars if hub_bars else hub.disable_progress_bars)()
    try:
        with no_loading_bars():
            assert not transformers_logging.is_progress_bar_enabled()
        assert transformers_logging.is_progress_bar_enabled() == bars
        assert hub.are_progress_bars_disabled() == (not hub_bars)
    finally:
        transformers_logging.enable_progress_bar()
