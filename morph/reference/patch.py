"""The patch on one loaded `qwen_tts.Qwen3TTSModel`: its TalkerLoop, the default seq_groups and mode, the codec
decoder's SnakeBeta activations, whose `forward` on this instance is, where Triton is installed, the fused kernel of
morph/kernels/snake.py on CUDA tensors (upstream's to rounding), and the talker's seam, `talker.generate`, an instance
attribute that shadows the class's method for this model only (site-packages and other loaded models are untouched;
deleting either restores upstream). Upstream's `Qwen3TTSForConditionalGeneration.generate` builds the prompt and
calls it once per batch; the reference loop (loop.py) answers with the frames: eager mode's static batches
(morph/render.py)."""

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

# The keyword arguments upstream's Qwen3TTSForConditionalGeneration.generate passes to
# talker.generate (qwen-tts 0.1.1); the loop takes all of them but the two output switches.
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
    on_step: StepCallback | None = None  # before each frame: progress and cancel hook in here
    row_stops: list[int] | None = None  # the frame at which each row ends (loop.generate)
    min_new_tokens: int | None = None  # frames before EOS may be drawn; None: what upstream's generate passes (2)


class MorphPatch:
    """The live patch on one model. `seq_groups` and `mode` are its defaults, changed between calls freely; a call's
    own inputs go in with `call`."""

    def __init__(self, tts, seq_groups: int = 5, mode: str = "auto"):
        talker = tts.model.talker
        if "generate" in vars(talker):
            raise RuntimeError("morph: this model is already patched; call remove() on the old patch first")
        # The instance attribute below bypasses the class's generate: if another pack patched that,
        # its patch stops applying to this model, and the log should say so.
        note_foreign_wrapper(type(talker).generate, "the talker's generate")
        self.talker = talker
        self.loop = TalkerLoop(self.talker)
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
        """The inputs of the generate calls made inside this block on this thread, which upstream's generate has no
        keyword for: seq_groups (the patch's when None), on_step() before each frame (an exception there stops the
        call and propagates), each row's last frame, the frames before EOS may be drawn (upstream's 2 when None).
        Nothing of them stays on the patch after the block."""
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
