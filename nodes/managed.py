"""A loaded model under ComfyUI's memory manager: what the Load model node outputs.

This module imports no ComfyUI: nodes/services.py, the seam, hands it ComfyUI's modules (`services.manage`).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..morph.memory import replays_graphs, working_memory
from ..morph.settings import GenerationSettings


class TTSWeights(torch.nn.Module):
    """Every weight of one loaded model, as one module ComfyUI's memory manager can move.

    qwen-tts keeps the speech tokenizer (the codec) as a plain attribute, outside the
    model's module tree, so it is registered here beside the talker.
    """

    def __init__(self, tts):
        super().__init__()
        self.talker = tts.tts.model
        self.codec = tts.tts.model.speech_tokenizer.model
        self.device = tts.device

    def get_dtype(self) -> torch.dtype:
        return next(self.talker.parameters()).dtype


class ManagedModel:
    """What the Load model node outputs (type QWEN3TTS_MODEL): the engine plus its memory manager hooks.

    Under ComfyUI (its comfy.model_patcher and comfy.model_management modules given, by
    services.manage) the weights are wrapped in a ModelPatcher. `ready()` asks ComfyUI to load
    them on the load device (freeing other models first if VRAM is short), then syncs the
    engine's device fields and gets the engine ready for the rows asked. When ComfyUI offloads
    the model ("Unload models", or to make room), the detach callback syncs the engine to the
    offload device and releases its state. Without ComfyUI there is no patcher, and `ready()`
    only gets the engine ready. No module-level cache holds it: when ComfyUI drops the node's
    output, the model is freed.
    """

    def __init__(self, tts, offload_device: str | None = None, model_patcher=None, model_management=None):
        self.tts = tts
        self.patcher = None
        self.load_device = tts.config.device  # where it runs: MorphTTS.load resolved it
        self.offload_device = torch.device(offload_device) if offload_device else tts.device
        self.model_management = model_management
        if model_patcher is not None and model_management is not None:
            self.patcher = model_patcher.ModelPatcher(TTSWeights(tts), load_device=self.load_device,
                                                      offload_device=self.offload_device)
            on_detach = getattr(getattr(model_patcher, "CallbacksMP", None), "ON_DETACH", None)
            if on_detach is not None:
                self.patcher.add_callback(on_detach, _synced_after_detach(tts, self.offload_device))

    @property
    def source(self) -> str:
        return self.tts.source

    def ready(self, memory_required: int = 0, width: int = 1, who: str = "Qwen3-TTS"):
        """The engine, with its weights on the load device and, under ComfyUI, `memory_required` bytes of working
        memory free beside them (morph.memory.working_memory estimates a run's). An engine not ready for batches of
        `width` rows (just loaded, wider runs asked for, or its state released by an offload) is made ready first,
        its short render declared too, so that the run itself compiles and captures nothing."""
        readying = (self.tts.ready_width or 0) < width and replays_graphs(self.tts, self.load_device)
        if readying:
            from ..morph.engine.runner import ready_lines  # the decode path loads with a model, not with the nodes

            lines = [(line.text, line.voice) for line in ready_lines(self.tts, width)]
            memory_required = max(memory_required, working_memory(self.tts, lines, GenerationSettings(), width,
                                                                  device=self.load_device))
        if self.patcher is not None:
            # force_full_load: the engine's modules are plain torch modules, which cannot run
            # split across devices (ComfyUI's partial loading is for its own cast-on-the-fly ops).
            self.model_management.load_models_gpu([self.patcher], memory_required=int(memory_required),
                                                    force_full_load=True)
            self.tts.to(self.load_device)
        if readying:
            self.tts.ready(width, who)
        return self.tts

    def __repr__(self) -> str:
        return f"<Qwen3-TTS model {self.tts.source} ({self.tts.variant}) on {self.tts.device}>"


def _synced_after_detach(tts, offload_device: torch.device) -> Callable:
    def on_detach(patcher, unpatch_all=True):
        # The patcher has already moved the weights; this moves the rest (the engine's device
        # fields and the state it caches on the old device) so the engine stays consistent and
        # the VRAM is really given back.
        # unpatch_all=False (a patcher being garbage-collected) moves nothing, so neither do we.
        if not unpatch_all:
            return
        tts.to(offload_device)
        release_engine_state(tts)
    return on_detach


def release_engine_state(tts) -> None:
    """Drop what the engine caches on a device outside the model's modules (static KV caches,
    CUDA graphs, stacked and fused weight storage); it is rebuilt on the next run."""
    release = getattr(tts, "release_device_state", None)
    if callable(release):
        release()
        return
    patch = getattr(tts, "patch", None)  # engines without release_device_state(): release the parts
    for part in (getattr(patch, "loop", None), getattr(patch, "predictor", None)):
        if callable(getattr(part, "release", None)):
            part.release()
