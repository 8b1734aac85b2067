"""Qwen3-TTS Load Model."""

from __future__ import annotations

import logging

from ..morph.qwen.checkpoints import DEFAULT_MODEL, HUB_MODELS
from ..morph.qwen.loading import resolve_device
from ..morph.settings import RETIRED_MODES
from . import services
from .common import CATEGORY, MODEL_TYPE, prefixed

# The engine's modes a user picks between, fastest first ("lean" is a debugging aid, not offered).
SPEED_MODES = ("auto", "fused", "graphs", "eager")

log = logging.getLogger(__name__)


class LoadModel:
    NODE_ID = "Qwen3TTSMorphLoadModel"
    DISPLAY_NAME = "Qwen3-TTS Load Model"
    DESCRIPTION = (
        "Loads a Qwen3-TTS-12Hz checkpoint (Base for voice cloning, CustomVoice, or VoiceDesign) with the fast morph "
        "code predictor attached. Pick a folder from models/qwen3-tts, or a hub id, which is downloaded into that "
        "folder on first use. ComfyUI's memory manager owns the model: 'Unload models' frees its VRAM, and it is "
        "reused across runs until these inputs change.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (MODEL_TYPE,)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The loaded model: connect it to Voice Prompt and the Generate nodes.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        local = services.list_local_models()
        choices = local + [m for m in HUB_MODELS if m not in local]  # a hub id is fetched on first use
        return {"required": {
            "model": (choices, {"default": DEFAULT_MODEL, "tooltip":
                      "A model folder in models/qwen3-tts (any folder holding config.json), or a Qwen hub id, "
                      "downloaded into models/qwen3-tts on first use. Base models clone voices; CustomVoice and "
                      "VoiceDesign models need their own Generate nodes."}),
            "dtype": (["auto", "bf16", "fp16", "fp32"], {"default": "auto", "tooltip":
                      "Weight precision. auto = bf16 on GPUs that support it (else fp16), fp32 on CPU."}),
            "attention": (["auto", "sdpa", "flash_attention_2", "eager"], {"default": "auto", "tooltip":
                          "Attention kernel. auto = flash_attention_2 when the flash-attn package imports, "
                          "else PyTorch sdpa (same output, no extra install)."}),
            "device": (["auto", "cuda", "cpu", "mps"], {"default": "auto", "tooltip":
                       "Where the model runs. auto = ComfyUI's device (honours --cpu and friends). A device this "
                       "machine lacks is refused with a message."}),
            "speed_mode": (list(SPEED_MODES), {"default": "auto", "tooltip":
                           "How the decode loop runs. auto = fused on a GPU (graphs without Triton), plain "
                           "PyTorch elsewhere. fused = the pack's Triton kernels inside CUDA graphs: the fastest; "
                           "the first run on a new machine compiles them in about 10 s, later ComfyUI starts "
                           "reuse them. graphs = PyTorch ops inside CUDA graphs, about 3x slower, no Triton "
                           "needed. eager = the checkpoint's own layers, op by op (bit-exact to "
                           "qwen-tts at seq_groups 15)."}),
        }}

    @classmethod
    def VALIDATE_INPUTS(cls, speed_mode):
        # Replaces ComfyUI's "value in list" check for speed_mode: a workflow saved with a retired mode
        # (compile) still queues, and the engine runs the mode that replaced it (and logs so).
        if speed_mode in SPEED_MODES or speed_mode in RETIRED_MODES:
            return True
        return f"{cls.DISPLAY_NAME}: speed_mode {speed_mode!r} is not one of {', '.join(SPEED_MODES)}"

    def load(self, model, dtype, attention, device, speed_mode="auto"):
        who = self.DISPLAY_NAME
        where = dict(search_dirs=services.model_dirs(), download_dir=services.download_dir())
        try:
            if device != "auto":
                resolve_device(device)  # refuses a device this machine lacks, before anything loads
            with services.messages_on_node():
                return self._load(model, dtype, attention, device, speed_mode, where, who)
        except Exception as e:
            raise prefixed(e, who) from e

    @staticmethod
    def _load(model, dtype, attention, device, speed_mode, where, who):
        from ..morph.decode.runner import device_note
        from ..morph.api import MorphTTS  # the decode path and its kernels load when a model does

        load_device, offload_device = services.choose_devices(device)
        target = resolve_device(load_device or device)
        note = device_note(speed_mode, target)
        if note:  # said here, where the mode is chosen, at every load
            log.warning("speed_mode: %s; auto picks the fastest mode this device runs", note)
        # without ComfyUI the model stays where it runs; with it, it rests on the offload device, loaded there with
        # the precision and kernel meant for the load device: before each run ComfyUI frees room for it and moves it
        tts = MorphTTS.load(model, device=str(target), dtype=dtype, attention=attention, mode=speed_mode,
                            place_on=offload_device, **where)
        managed = services.manage(tts, offload_device)
        managed.ready(who=who)  # Triton's compiles and one row's captures happen here, said on the node, not in a run
        return (managed,)
