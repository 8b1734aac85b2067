"""Silence the known-harmless messages that importing and loading qwen-tts prints (the 25 Hz tokenizer's flash-attn
banner, transformers 5.x's docstring checker and deprecations, sox's absence, generate's repetition-penalty note),
and nothing else: anything else printed, logged or warned inside `quiet_third_party()` passes."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import subprocess
import sys
import warnings

KNOWN_PRINTS = re.compile(r"flash-attn is not installed|^\*+$|is part of .*, but not documented|"
                          r"is part of .*'s signature, but not documented")
KNOWN_LOGS = re.compile(r"SoX could not be found|`check_model_inputs` decorator is deprecated|"
                        r"`layer_type_validation` is deprecated")
KNOWN_WARNINGS = (r"`rope_scaling` is deprecated", r"`rope_config_validation` is deprecated",
                  r"Passing `repetition_penalty` with `inputs_embeds`")
_LOGGERS = ("", "transformers", "sox")  # the handlers these loggers write through get the filter


class _DropKnown(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not KNOWN_LOGS.search(record.getMessage())


def _quiet_popen(cmd, mode="r", buffering=-1):
    """os.popen without the child's stderr: sox's import runs `sox -h` through a shell that prints 'sox: not found'."""
    proc = subprocess.Popen(cmd, shell=True, text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            bufsize=buffering)
    return os._wrap_close(proc.stdout, proc)


@contextlib.contextmanager
def quiet_third_party():
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    handlers = {h for logger in loggers for h in logger.handlers}
    drop = _DropKnown()
    for target in (*handlers, *loggers):
        target.addFilter(drop)
    popen = os.popen
    if "sox" not in sys.modules:
        os.popen = _quiet_popen
    printed = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(printed):
            for message in KNOWN_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        os.popen = popen
        for target in (*handlers, *loggers):
            target.removeFilter(drop)
        kept = [line for line in printed.getvalue().splitlines() if line.strip() and not KNOWN_PRINTS.search(line)]
        if kept:
            print("\n".join(kept))


@contextlib.contextmanager
def no_loading_bars():
    """transformers' (and with them huggingface_hub's) progress bars off for the block, then back as they were: a
    local load takes seconds, and its bars tell a caller nothing."""
    from huggingface_hub import utils as hub
    from transformers.utils import logging as transformers_logging

    bars, hub_bars = transformers_logging.is_progress_bar_enabled(), not hub.are_progress_bars_disabled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the hub's note that HF_HUB_DISABLE_PROGRESS_BARS, when set, decides
        transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if bars:
                transformers_logging.enable_progress_bar()
            (hub.enable_progress_bars if hub_bars else hub.disable_progress_bars)()
