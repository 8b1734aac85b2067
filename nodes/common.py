"""What the nodes share: types, the generation widgets, and the run-with-progress-and-cancel helper."""

from __future__ import annotations

import numpy as np
import torch

from ..morph.qwen.checkpoints import LANGUAGES as RELEASED_LANGUAGES
from ..morph.memory import working_memory
from ..morph.settings import DEFAULT_SEQ_GROUPS, MAX_SEQ_GROUPS, SAMPLE_RATE, GenerationSettings, Sampling
from . import services

CATEGORY = "audio/Qwen3-TTS"
MODEL_TYPE = "QWEN3TTS_MODEL"
VOICE_TYPE = "QWEN3TTS_VOICE"

# The languages of the released 12 Hz models; the engine checks the choice against the loaded model.
LANGUAGES = list(RELEASED_LANGUAGES)
SEED_MAX = 0xFFFFFFFFFFFFFFFF
MAX_NEW_TOKENS_LIMIT = 16384  # frames (12.5 a second): about 22 minutes

_DEFAULTS = GenerationSettings()
_SUB = Sampling()


def model_input(what: str = "") -> tuple:
    return (MODEL_TYPE, {"tooltip": "The model from Qwen3-TTS Load Model." + (f" {what}" if what else "")})


def text_input(tooltip: str, default: str = "") -> tuple:
    return ("STRING", {"multiline": True, "default": default, "tooltip": tooltip})


def speech_text_input() -> tuple:
    return text_input("The words to speak (the NEW text, not the reference clip's transcript). "
                      "Text over 500 characters is split at sentence ends and the parts are rendered together "
                      "as one batch, in the same voice. The seed is set once per batch, not per part: the parts "
                      "draw from one random stream, so a part can sound different from the same words alone.",
                      "Hello! This is Qwen3-TTS, speaking inside ComfyUI.")


def generation_inputs() -> dict:
    """The widgets every generate node ends with, in this order (workflows rely on it)."""
    return {
        "language": (LANGUAGES, {"default": "Auto", "tooltip":
                     "Language of the text. Auto detects it; naming it helps short or mixed texts."}),
        "seq_groups": ("INT", {"default": DEFAULT_SEQ_GROUPS, "min": 1, "max": MAX_SEQ_GROUPS, "step": 1, "tooltip":
                       f"How many of the {MAX_SEQ_GROUPS} code groups of each frame the code predictor runs one "
                       f"by one; the rest are predicted together. {MAX_SEQ_GROUPS} = closest to upstream (slowest; "
                       f"bit-exact in mode eager), "
                       f"lower = faster. {DEFAULT_SEQ_GROUPS} is the default balance of speed and quality."}),
        "seed": ("INT", {"default": 0, "min": 0, "max": SEED_MAX, "control_after_generate": True, "tooltip":
                 "Random seed. The same seed, text and settings give the same audio."}),
        "max_new_tokens": ("INT", {"default": 0, "min": 0, "max": MAX_NEW_TOKENS_LIMIT, "step": 1, "tooltip":
                           "Longest output in codec frames (12.5 per second). 0 = auto: a bound derived from "
                           "the text length, so a missed end-of-speech cannot run on for minutes."}),
        "do_sample": ("BOOLEAN", {"default": _DEFAULTS.do_sample, "tooltip":
                      "Sample the talker's tokens (recommended). Off = greedy, which often loops or hums."}),
        "temperature": ("FLOAT", {"default": _DEFAULTS.temperature, "min": 0.01, "max": 2.0, "step": 0.01,
                        "tooltip": "Talker sampling temperature: higher = livelier and less stable."}),
        "top_k": ("INT", {"default": _DEFAULTS.top_k, "min": 0, "max": 4096, "step": 1,
                  "tooltip": "Talker top-k: sample among the k likeliest tokens. 0 = off."}),
        "top_p": ("FLOAT", {"default": _DEFAULTS.top_p, "min": 0.01, "max": 1.0, "step": 0.01,
                  "tooltip": "Talker top-p (nucleus) sampling. 1.0 = off."}),
        "repetition_penalty": ("FLOAT", {"default": _DEFAULTS.repetition_penalty, "min": 0.5, "max": 3.0,
                               "step": 0.01, "tooltip": "Penalty on repeated talker tokens. 1.0 = none."}),
        "subtalker_do_sample": ("BOOLEAN", {"default": _SUB.do_sample, "tooltip":
                                "Sample the code predictor's tokens (codec groups 2-16) too. Off = greedy."}),
        "subtalker_temperature": ("FLOAT", {"default": _SUB.temperature, "min": 0.01, "max": 2.0, "step": 0.01,
                                  "tooltip": "Code predictor sampling temperature."}),
        "subtalker_top_k": ("INT", {"default": _SUB.top_k, "min": 0, "max": 2048, "step": 1,
                            "tooltip": "Code predictor top-k. 0 = off."}),
        "subtalker_top_p": ("FLOAT", {"default": _SUB.top_p, "min": 0.01, "max": 1.0, "step": 0.01,
                            "tooltip": "Code predictor top-p. 1.0 = off."}),
    }


GENERATION_WIDGETS = tuple(generation_inputs())

SPLIT_LONG_TEXT_INPUT = ("BOOLEAN", {"default": True, "tooltip":
                         "Split text over 500 characters at sentence ends, render the parts together in the same "
                         "voice (one batch, seeded once per batch), and join them with short pauses. Off: such text is refused with an error instead."})


def split_generation_options(options: dict) -> tuple[str, GenerationSettings]:
    """The generate nodes' shared widget values -> (language, GenerationSettings)."""
    unknown = set(options) - set(GENERATION_WIDGETS)
    if unknown:
        raise TypeError(f"unexpected inputs {sorted(unknown)}")
    o = {**{k: v[1]["default"] for k, v in generation_inputs().items()}, **options}
    settings = GenerationSettings(
        seq_groups=int(o["seq_groups"]), do_sample=bool(o["do_sample"]), temperature=float(o["temperature"]),
        top_k=int(o["top_k"]), top_p=float(o["top_p"]), repetition_penalty=float(o["repetition_penalty"]),
        subtalker=Sampling(bool(o["subtalker_do_sample"]), float(o["subtalker_temperature"]),
                           int(o["subtalker_top_k"]), float(o["subtalker_top_p"])),
        seed=int(o["seed"]), max_new_tokens=int(o["max_new_tokens"]) or None,
    )
    return str(o["language"]), settings


def run_generation(model, generate, who: str, settings: GenerationSettings, text: str, voice=None,
                   instruct: str = "") -> dict:
    """Load the model through ComfyUI's memory manager with room for this text's run, run
    `generate(tts, on_step)` with per-step progress and cancel, and return the result as AUDIO.
    Cancel raises ComfyUI's interrupt; warnings and status lines are shown on the node."""
    settings.validate(who)  # before the weights move
    services.check_interrupt()
    with services.messages_on_node():
        tts = model.ready(working_memory(model.tts, [(str(text), voice)], settings, instruct=str(instruct),
                                         device=model.load_device), who=who)
        wav = generate(tts, services.step_callback())
    return to_audio(wav, SAMPLE_RATE)


def to_audio(wav, sample_rate: int) -> dict:
    """A mono clip [T] -> ComfyUI AUDIO: float32 CPU waveform [1, 1, T]."""
    waveform = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32)).reshape(1, 1, -1)
    return {"waveform": waveform, "sample_rate": int(sample_rate)}


def prefixed(error: Exception, who: str) -> Exception:
    """The same error with the node's name in front, as every message of this pack has."""
    message = str(error)
    if message.startswith(f"{who}:"):
        return error
    try:
        new = type(error)(f"{who}: {message}")
    except Exception:  # an exception type with an unusual constructor
        new = RuntimeError(f"{who}: {message}")
    new.__cause__ = error
    return new
