"""Attach the morph engine to one loaded `qwen_tts.Qwen3TTSModel`, and detach it.

Two seams, both instance attributes that shadow a class method for this model only
(site-packages and other loaded models are untouched; deleting them restores upstream):

- A. `talker.code_predictor.generate`: the talker calls it once per frame with
  inputs_embeds [B, 2, H] and reads `.sequences` [B, 15]. The morph predictor answers,
  op by op ("eager"/"lean") or from a CUDA graph ("graphs"/"compile").
- B. `talker.generate`: on CUDA in modes "lean", "graphs" and "compile" the morph talker
  loop (morph/talker_loop.py) owns the whole decode, with a static KV cache and one
  CUDA graph per frame. Anything it does not handle goes to upstream's generate, which
  then still uses seam A.

mode "auto" is "graphs" on CUDA and "eager" elsewhere; "eager" is upstream's talker
with the morph predictor, exact against qwen-tts at seq_groups=15.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Callable

import torch

from . import graphs
from .lean import LeanUnsupported
from .predictor import MorphPredictor, check_seq_groups
from .sampling import Sampling
from .talker_loop import TalkerLoop

log = logging.getLogger(__name__)

StepCallback = Callable[[], None]

# The keyword arguments upstream's Qwen3TTSForConditionalGeneration.generate passes to
# talker.generate; seam B handles exactly these.
_TALKER_KWARGS = {
    "inputs_embeds", "attention_mask", "trailing_text_hidden", "tts_pad_embed", "max_new_tokens", "min_new_tokens",
    "do_sample", "top_k", "top_p", "temperature", "subtalker_dosample", "subtalker_top_k", "subtalker_top_p",
    "subtalker_temperature", "eos_token_id", "repetition_penalty", "suppress_tokens", "output_hidden_states",
    "return_dict_in_generate",
}


class MorphPatch:
    """The live patch on one model. Change `seq_groups`, `mode` or `on_step` between calls freely."""

    def __init__(self, tts, seq_groups: int = 5, mode: str = "auto"):
        self.talker = tts.model.talker
        self.code_predictor = self.talker.code_predictor
        if "generate" in vars(self.code_predictor) or "generate" in vars(self.talker):
            raise RuntimeError("morph: this model is already patched; call remove() on the old patch first")
        self.predictor = MorphPredictor(self.code_predictor)
        self.loop = TalkerLoop(self.talker, self.predictor)
        self.seq_groups = check_seq_groups(seq_groups, self.predictor.num_groups)
        self.mode = mode
        self._lean_ok: bool | None = None
        # Called once per frame before decoding it: progress and cancel hook in here.
        self.on_step: StepCallback | None = None
        self.code_predictor.generate = self._generate
        self.talker.generate = self._talker_generate

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self._mode = graphs.check_mode(mode)
        self.predictor.mode = self._mode

    def resolved_mode(self, device: torch.device) -> str:
        """The mode a call on `device` runs in (see morph/graphs.py)."""
        mode = graphs.resolve_mode(self.mode, device)
        if mode != "eager" and not self._lean_supported():
            return "eager"
        return mode

    def _lean_supported(self) -> bool:
        if self._lean_ok is None:
            try:
                self.predictor.stack.dims, self.loop.stack.dims  # noqa: B018 - builds the fused stacks' dims
                self._lean_ok = True
            except LeanUnsupported as e:
                log.warning("morph: lean layers do not support this checkpoint (%s); running eager", e)
                self._lean_ok = False
        return self._lean_ok

    # -- seam A -----------------------------------------------------------------------
    def _generate(self, inputs_embeds, do_sample=True, top_p=1.0, top_k=50, temperature=0.9, **_unused):
        if self.on_step is not None:
            self.on_step()
        sampling = Sampling(bool(do_sample), float(temperature), int(top_k or 0), float(top_p))
        mode = self.resolved_mode(inputs_embeds.device)
        return SimpleNamespace(sequences=self.predictor.predict(inputs_embeds, self.seq_groups, sampling, mode))

    # -- seam B -----------------------------------------------------------------------
    def _talker_generate(self, *args, **kwargs):
        upstream = type(self.talker).generate
        embeds = kwargs.get("inputs_embeds")
        if args or embeds is None or not set(kwargs) <= _TALKER_KWARGS:
            return upstream(self.talker, *args, **kwargs)
        mode = self.resolved_mode(embeds.device)
        if mode == "eager" or (mode in graphs.GRAPH_MODES and self.loop.graph_failed):
            return upstream(self.talker, *args, **kwargs)
        loop_kwargs = {k: v for k, v in kwargs.items() if k not in ("output_hidden_states", "return_dict_in_generate")}
        try:
            return self.loop.generate(**loop_kwargs, seq_groups=self.seq_groups, mode=mode, on_step=self.on_step)
        except graphs.GraphUnavailable:
            return upstream(self.talker, *args, **kwargs)

    @property
    def last_run(self) -> dict:
        """What the last seam-B call did: mode, frames, capture seconds, cache capacity."""
        return dict(self.loop.last_run)

    def remove(self) -> None:
        vars(self.code_predictor).pop("generate", None)
        vars(self.talker).pop("generate", None)
        self.loop.release()
        self.predictor.release()


def patch(tts, seq_groups: int = 5, mode: str = "auto") -> MorphPatch:
    """Replace the code predictor's generate loop (and on CUDA the talker's decode) on this model instance."""
    return MorphPatch(tts, seq_groups, mode)
