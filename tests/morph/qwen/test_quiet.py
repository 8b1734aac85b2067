"""morph.qwen.quiet: only the known third-party messages are dropped."""

import logging
import warnings

from morph.qwen.quiet import quiet_third_party


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
