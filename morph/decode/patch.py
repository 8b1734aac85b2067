"""The decode's hold on one loaded `qwen_tts.Qwen3TTSModel`: its TalkerLoop, the default seq_groups and mode, and the
codec decoder's SnakeBeta activations, whose `forward` on this instance is, where Triton is installed, the fused kernel
of morph/kernels/snake.py on CUDA tensors (upstream's to rounding); deleting it restores upstream. The talker's seam
is morph/reference/patch.py's."""

from __future__ import annotations

import functools

from ..settings import check_seq_groups
from .. import graphs
from . import runner
from .talker_loop import TalkerLoop


class DecodePatch:
    """The decode on one model. `seq_groups` and `mode` are its defaults, changed between calls freely."""

    def __init__(self, tts, seq_groups: int = 5, mode: str = "auto"):
        self.talker = tts.model.talker
        self.loop = TalkerLoop(self.talker)
        self.seq_groups = check_seq_groups(seq_groups, self.loop.predictor.num_groups)
        self.mode = runner.check_mode(mode)
        self.snakes = [m for m in tts.model.speech_tokenizer.model.modules() if type(m).__name__ == "SnakeBeta"]
        if self.snakes and graphs.triton_available():
            from ..kernels import snake  # Triton: imported only where it is installed

            for m in self.snakes:
                m.forward = functools.partial(snake.forward, m)

    def resolved_mode(self, device) -> str:
        """What the mode runs as on `device`: eager, lean, graphs or fused (runner.resolve)."""
        return runner.resolve(self.mode, device, self.loop.lean_check)

    @property
    def last_run(self) -> dict:
        """What the last call did: mode, frames, capture seconds, cache capacity."""
        return dict(self.loop.last_run)

    def remove(self) -> None:
        for m in self.snakes:
            vars(m).pop("forward", None)
        self.loop.release()
