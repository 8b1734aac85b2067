"""The patch on one loaded `qwen_tts.Qwen3TTSModel`: its TalkerLoop, default seq_groups and mode, the fused SnakeBeta
kernel where Triton is installed, and the seam `talker.generate`, which the reference loop answers. Both are instance
attributes, so site-packages and other models are untouched, and deleting them restores upstream."""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from typing import Callable

from .. import graphs
from ..decode import runner
from ..decode.talker_loop import TalkerLoop
from ..qwen.marks import note_foreign_wrapper
from ..settings import check_seq_groups
from . import loop

StepCallback = Callable[[], None]

# What upstream's generate passes talker.generate (qwen-tts 0.1.1); the loop takes all but the two output switches.
_TALKER_KWARGS = {
    "inputs_embeds", "attention_mask", "trailing_text_hidden", "tts_pad_embed", "max_new_tokens", "min_new_tokens",
    "do_sample", "top_k", "top_p", "temperature", "subtalker_dosample", "subtalker_top_k", "subtalker_top_p",
    "subtalker_temperature", "eos_token_id", "repetition_penalty", "suppress_tokens", "output_hidden_states",
    "return_dict_in_generate",
}


@dataclass(frozen=True)
class CallInputs:
    """What one call's decode needs beyond the keywords upstream's generate passes the talker (MorphPatch.call)."""

    seq_groups: int
    on_step: StepCallback | None = None  # before each frame: progress and cancel hook in here; raising stops the call
    row_stops: list[int] | None = None  # the frame at which each row ends (loop.generate)
    min_new_tokens: int | None = None  # frames before EOS may be drawn; None: what upstream's generate passes (2)


class MorphPatch:
    """The live patch on one model; `seq_groups` and `mode` are defaults, a call's own inputs go in with `call`."""

    def __init__(self, tts, seq_groups: int = 5, mode: str = "auto"):
        talker = tts.model.talker
        if "generate" in vars(talker):
            raise RuntimeError("morph: this model is already patched; call remove() on the old patch first")
        # the instance attribute below bypasses another pack's patch of the class's generate: the log says so
        note_foreign_wrapper(type(talker).generate, "the talker's generate")
        self.talker, self.loop = talker, TalkerLoop(talker)
        self.seq_groups = check_seq_groups(seq_groups, self.loop.predictor.num_groups)
        self.mode = runner.check_mode(mode)
        self.snakes = [m for m in tts.model.speech_tokenizer.model.modules() if type(m).__name__ == "SnakeBeta"]
        if self.snakes and graphs.triton_available():
            from ..kernels import snake  # Triton: imported only where it is installed

            for m in self.snakes:
                m.forward = functools.partial(snake.forward, m)
        self._local = threading.local()  # per thread: a call's inputs
        talker.generate = self._talker_generate

    def resolved_mode(self, device) -> str:
        """What the mode runs as on `device`: eager, lean, graphs or fused (runner.resolve)."""
        return runner.resolve(self.mode, device, self.loop.lean_check)

    @property
    def last_run(self) -> dict:
        """What the last call did: mode, frames, capture seconds, cache capacity."""
        return dict(self.loop.last_run)

    def _talker_generate(self, *args, **kwargs):
        unexpected = sorted(set(kwargs) - _TALKER_KWARGS) + (["positional arguments"] if args else [])
        if unexpected:
            raise RuntimeError(f"morph: talker.generate was called with {', '.join(unexpected)}, which this qwen-tts "
                               "version does not pass; install qwen-tts 0.1.1 (see the README)")
        loop_kwargs = {k: v for k, v in kwargs.items() if k not in ("output_hidden_states", "return_dict_in_generate")}
        call = getattr(self._local, "call", None) or CallInputs(self.seq_groups)
        if call.min_new_tokens is not None:
            loop_kwargs["min_new_tokens"] = call.min_new_tokens
        return loop.generate(self.loop, **loop_kwargs, seq_groups=call.seq_groups, on_step=call.on_step,
                             row_stops=call.row_stops)

    @contextlib.contextmanager
    def call(self, seq_groups: int | None = None, on_step: StepCallback | None = None,
             row_stops: list[int] | None = None, min_new_tokens: int | None = None):
        """Inputs upstream's generate has no keyword for (CallInputs), for the calls in this block on this thread."""
        outer = getattr(self._local, "call", None)
        seq_groups = self.seq_groups if seq_groups is None else check_seq_groups(seq_groups,
                                                                                 self.loop.predictor.num_groups)
        self._local.call = CallInputs(seq_groups, on_step, row_stops, min_new_tokens)
        try:
            yield
        finally:
            self._local.call = outer

    def remove(self) -> None:
        vars(self.talker).pop("generate", None)
        for m in self.snakes:
            vars(m).pop("forward", None)
        self.loop.release()
