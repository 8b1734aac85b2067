"""Silence the known-harmless messages that importing and loading qwen-tts prints, and nothing else.

Each pattern below is a message that looks alarming on a run that works:
  - qwen-tts's 25 Hz tokenizer prints a flash-attn banner on import (12 Hz models never use that code);
  - transformers 5.x's docstring checker prints "[ERROR] `cache_position` is part of ...'s signature, but
    not documented" for qwen-tts's classes while they are defined;
  - the sox package logs "SoX could not be found!" (and its shell prints "sox: not found"): 12 Hz models
    never call sox;
  - transformers 5.x warns that APIs qwen-tts 0.1.1 uses (check_model_inputs, rope_scaling,
    rope_config_validation, layer_type_validation) are deprecated;
  - transformers' generate warns that the repetition penalty skips the prompt: upstream qwen-tts behaves
    the same way by design.
Only inside `quiet_third_party()`, and only these: anything else printed is printed after the block,
other log records and warnings pass, and exceptions propagate untouched.
"""

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
    """os.popen without the child's stderr: sox's import runs `sox -h` through a shell that prints
    'sox: not found' straight to the terminal when the program is absent."""
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
    """transformers' progress bars off for the block, and back as they were after it: a load from a local folder
    takes seconds, and its "Loading weights" bars tell a caller nothing. transformers turns huggingface_hub's bars
    off and on with its own, so theirs are put back as they were too."""
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
