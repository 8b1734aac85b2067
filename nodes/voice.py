"""Qwen3-TTS Voice Prompt, Save Voice and Load Voice. Voice files are safetensors, never pickles."""

from __future__ import annotations

import logging
import re

from ..morph.lines.words import FOR_NODES
from ..morph.lines.voice import load_voice, save_voice
from . import services
from .common import CATEGORY, VOICE_TYPE, model_input, text_input

log = logging.getLogger(__name__)
_UNSAFE = re.compile(r"[^\w\- .]")


class VoicePrompt:
    NODE_ID = "Qwen3TTSMorphVoicePrompt"
    DISPLAY_NAME = "Qwen3-TTS Voice Prompt"
    DESCRIPTION = (
        "Builds a reusable voice from a reference clip (any sample rate, mono or stereo; 3-10 s of clean speech "
        "works best). With the clip's transcript the voice uses in-context cloning (closest match); without one, "
        "or with x_vector_only on, it uses only the speaker embedding (x-vector). Needs a Base model.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (VOICE_TYPE,)
    RETURN_NAMES = ("voice",)
    OUTPUT_TOOLTIPS = ("The voice: connect it to Generate (Voice Clone) or Save Voice.",)
    FUNCTION = "make"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": model_input("Must be a Base model."),
            "audio": ("AUDIO", {"tooltip": "The reference clip of the voice to clone (e.g. from Load Audio)."}),
            "transcript": text_input("Exactly what is said in the reference clip (NOT the text to generate). "
                                     "Leave empty for x-vector-only cloning."),
            "x_vector_only": ("BOOLEAN", {"default": False, "tooltip":
                              "Use only the speaker embedding, ignoring the transcript: less faithful, but "
                              "never leaks the reference's words. Always on when the transcript is empty."}),
        }}

    def make(self, model, audio, transcript, x_vector_only):
        who = self.DISPLAY_NAME
        if not isinstance(audio, dict) or "waveform" not in audio or "sample_rate" not in audio:
            raise ValueError(f"{who}: audio is not a ComfyUI AUDIO; connect Load Audio (or another audio output)")
        services.check_interrupt()
        with services.messages_on_node():
            tts = model.ready(who=who)
            voice = tts.make_voice(audio["waveform"], int(audio["sample_rate"]), transcript=transcript,
                                   x_vector_only=bool(x_vector_only), who=who, words=FOR_NODES)
        return (voice,)


def voice_file_name(name: str, who: str) -> str:
    """A safe file name for a voice: no folders, no traversal, always *.safetensors."""
    stem = str(name).strip()
    if stem.lower().endswith(services.VOICE_SUFFIX):
        stem = stem[: -len(services.VOICE_SUFFIX)]
    stem = _UNSAFE.sub("_", stem).strip()
    if not stem or stem.startswith("."):
        raise ValueError(f"{who}: {name!r} is not a usable voice name; use letters, digits, '-' or '_', "
                         "e.g. my_voice")
    return stem + services.VOICE_SUFFIX


def voice_file(name) -> str:
    """Load Voice's value as a file name: a bare voice name (what Save Voice's name widget holds) gains
    .safetensors. The example workflow saves the bare name: ComfyUI's frontend flags a combo value that
    ends in a model suffix and is not in the node's list as a missing model (missingModelScan.ts)."""
    name = str(name or "").strip()
    return name if not name or name.lower().endswith(services.VOICE_SUFFIX) else name + services.VOICE_SUFFIX


class SaveVoice:
    NODE_ID = "Qwen3TTSMorphSaveVoice"
    DISPLAY_NAME = "Qwen3-TTS Save Voice"
    DESCRIPTION = (
        "Saves a voice as <name>.safetensors in the voices folder (models/qwen3-tts/voices), overwriting a voice "
        "of the same name. Voice files hold only tensors and text metadata, so sharing them is safe (no pickle). "
        "Reuse it with Load Voice, on a model of the same size.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("file_name",)
    OUTPUT_TOOLTIPS = ("The saved file's name; connect it to Load Voice's file_name to load it in the same run.",)
    OUTPUT_NODE = True
    FUNCTION = "save"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "voice": (VOICE_TYPE, {"tooltip": "The voice to save (from Voice Prompt)."}),
            "name": ("STRING", {"default": "my_voice", "tooltip":
                     "File name, without folders; .safetensors is added. Characters other than letters, "
                     "digits, '-', '_', '.' and spaces become '_'."}),
        }}

    def save(self, voice, name):
        who = self.DISPLAY_NAME
        file_name = voice_file_name(name, who)
        path = services.voices_save_dir() / file_name
        try:
            save_voice(voice, path)
        except OSError as e:
            raise OSError(f"{who}: could not write {path} ({e}); check the folder's permissions and free space") from e
        log.info("%s: saved %s", who, path)
        services.show_text(f"saved {file_name} in {path.parent}")
        return {"ui": {"text": [f"saved {file_name}"]}, "result": (file_name,)}


class LoadVoice:
    NODE_ID = "Qwen3TTSMorphLoadVoice"
    DISPLAY_NAME = "Qwen3-TTS Load Voice"
    DESCRIPTION = (
        "Loads a voice saved by Save Voice from the voices folder (models/qwen3-tts/voices). The file is checked "
        "before use; it is safetensors, never a pickle, so a shared voice file cannot run code.")
    CATEGORY = CATEGORY
    RETURN_TYPES = (VOICE_TYPE,)
    RETURN_NAMES = ("voice",)
    OUTPUT_TOOLTIPS = ("The voice: connect it to Generate (Voice Clone).",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "voice": (services.list_voice_files(), {"tooltip":
                          "A saved voice in models/qwen3-tts/voices (a bare name, as Save Voice's name, means "
                          "<name>.safetensors). Empty until you save one with Save Voice "
                          "(press R to refresh the list after saving)."}),
            },
            "optional": {
                "file_name": ("STRING", {"forceInput": True, "tooltip":
                              "Optional: a voice file name from Save Voice. When connected it is used instead of "
                              "the list, and the voice is saved before it is loaded."}),
            },
        }

    @classmethod
    def VALIDATE_INPUTS(cls, voice):
        # Replaces ComfyUI's "value in list" check: a voice saved earlier in the same run is not in the
        # list yet. Whether the file exists is checked when loading.
        if not isinstance(voice, str) or not voice.strip() or "/" in voice or "\\" in voice \
                or voice.strip().startswith("."):
            return (f"{cls.DISPLAY_NAME}: {voice!r} is not a voice file name; pick a voice from the list, "
                    "or save one with Qwen3-TTS Save Voice first")
        return True

    @classmethod
    def IS_CHANGED(cls, voice, file_name=None):
        path = services.find_voice_file(voice_file(file_name or voice))
        return "missing" if path is None else f"{path}:{path.stat().st_mtime_ns}"

    def load(self, voice, file_name=None):
        who = self.DISPLAY_NAME
        name = voice_file(file_name or voice)
        path = services.find_voice_file(name)
        if path is None:
            folders = ", ".join(str(d) for d in services.voices_dirs())
            raise FileNotFoundError(f"{who}: no voice file named {name!r} in {folders}; save one with "
                                    "Qwen3-TTS Save Voice, or pick another")
        return (load_voice(path, who=who, words=FOR_NODES),)
