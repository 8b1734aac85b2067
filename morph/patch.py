"""Attach the morph predictor to one loaded `qwen_tts.Qwen3TTSModel`, and detach it.

The talker calls `code_predictor.generate(inputs_embeds=[B, 2, H], ...)` once per
frame and reads `.sequences` [B, 15]. An instance attribute named `generate` shadows
the class method for this model only: site-packages and other loaded models are
untouched, and deleting the attribute restores upstream behaviour.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

from .predictor import MorphPredictor, check_seq_groups
from .sampling import Sampling

StepCallback = Callable[[], None]


class MorphPatch:
    """The live patch on one model. Change `seq_groups` or `on_step` between calls freely."""

    def __init__(self, tts, seq_groups: int = 5):
        self.code_predictor = tts.model.talker.code_predictor
        if "generate" in vars(self.code_predictor):
            raise RuntimeError("morph: this model is already patched; call remove() on the old patch first")
        self.predictor = MorphPredictor(self.code_predictor)
        self.seq_groups = check_seq_groups(seq_groups, self.predictor.num_groups)
        # Called once per frame before decoding it: progress and cancel hook in here.
        self.on_step: StepCallback | None = None
        self.code_predictor.generate = self._generate

    def _generate(self, inputs_embeds, do_sample=True, top_p=1.0, top_k=50, temperature=0.9, **_unused):
        if self.on_step is not None:
            self.on_step()
        sampling = Sampling(bool(do_sample), float(temperature), int(top_k or 0), float(top_p))
        return SimpleNamespace(sequences=self.predictor.predict(inputs_embeds, self.seq_groups, sampling))

    def remove(self) -> None:
        vars(self.code_predictor).pop("generate", None)
        self.predictor.release()


def patch(tts, seq_groups: int = 5) -> MorphPatch:
    """Replace the code predictor's generate loop on this model instance."""
    return MorphPatch(tts, seq_groups)
