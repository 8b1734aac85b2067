"""The three generate nodes: voice clone (Base), CustomVoice and VoiceDesign. They share their
sampling widgets and their run-with-progress-and-cancel code (common.py)."""

from __future__ import annotations

from .common import CATEGORY, SPLIT_LONG_TEXT_INPUT, VOICE_TYPE, generation_inputs, model_input, run_generation, speech_text_input, \
    split_generation_options, text_input

# The speakers of the released CustomVoice checkpoints. The loaded model's own list is checked at
# run time, and the error names the speakers it has.
SPEAKERS = ["Vivian", "Serena", "Uncle_Fu", "Dylan", "Eric", "Ryan", "Aiden", "Ono_Anna", "Sohee"]

_SHARED_HELP = (" seq_groups trades speed for exactness (15 = closest to upstream, bit-exact in mode eager; lower = faster). Shows per-step "
                "progress and stops within one step on Cancel. max_new_tokens 0 bounds the length by the text, so "
                "a missed end-of-speech cannot run on.")


class _GenerateNode:
    """What the three generate nodes have in common besides their widgets."""

    CATEGORY = CATEGORY
    RETURN_TYPES = ("AUDIO",)
    RETURN_NAMES = ("audio",)
    OUTPUT_TOOLTIPS = ("Mono speech at 24 kHz: connect it to Save Audio, Preview Audio or "
                       "Qwen3-TTS Smooth & Normalize.",)
    FUNCTION = "generate"


class GenerateVoiceClone(_GenerateNode):
    NODE_ID = "Qwen3TTSMorphGenerate"
    DISPLAY_NAME = "Qwen3-TTS Generate (Voice Clone)"
    DESCRIPTION = "Speaks the text in a cloned voice (from Voice Prompt or Load Voice) with a Base model." + _SHARED_HELP

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": model_input("Must be a Base model of the same size the voice was made with."),
            "voice": (VOICE_TYPE, {"tooltip": "The voice to speak with (from Voice Prompt or Load Voice)."}),
            "text": speech_text_input(),
            **generation_inputs(),
            "split_long_text": SPLIT_LONG_TEXT_INPUT,
        }}

    def generate(self, model, voice, text, split_long_text=True, **options):
        language, settings = split_generation_options(options)
        return (run_generation(model, lambda tts, on_step: tts.clone(
            text, voice, language=language, settings=settings, on_step=on_step, who=self.DISPLAY_NAME,
            split_long_text=split_long_text), self.DISPLAY_NAME, settings, text, voice=voice),)


class GenerateCustomVoice(_GenerateNode):
    NODE_ID = "Qwen3TTSMorphCustomVoice"
    DISPLAY_NAME = "Qwen3-TTS Generate (CustomVoice)"
    DESCRIPTION = ("Speaks the text with one of a CustomVoice model's built-in speakers, optionally styled by an "
                   "instruction (1.7B models)." + _SHARED_HELP)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": model_input("Must be a CustomVoice model."),
            "text": speech_text_input(),
            "speaker": (SPEAKERS, {"default": SPEAKERS[0], "tooltip":
                        "The built-in speaker (the released CustomVoice models' nine). A model with other "
                        "speakers reports its list if this one is missing."}),
            "instruct": text_input("Optional speaking style, e.g. 'Speak slowly, in a whisper.' "
                                   "The 0.6B CustomVoice model ignores it."),
            **generation_inputs(),
            "split_long_text": SPLIT_LONG_TEXT_INPUT,
        }}

    def generate(self, model, text, speaker, instruct, split_long_text=True, **options):
        language, settings = split_generation_options(options)
        return (run_generation(model, lambda tts, on_step: tts.custom_voice(
            text, speaker, instruct=instruct, language=language, settings=settings, on_step=on_step,
            who=self.DISPLAY_NAME, split_long_text=split_long_text), self.DISPLAY_NAME, settings, text,
            instruct=instruct),)


class GenerateVoiceDesign(_GenerateNode):
    NODE_ID = "Qwen3TTSMorphVoiceDesign"
    DISPLAY_NAME = "Qwen3-TTS Generate (VoiceDesign)"
    DESCRIPTION = ("Speaks the text in a voice described in words (a VoiceDesign model): age, gender, timbre, "
                   "emotion, pace." + _SHARED_HELP)

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {
            "model": model_input("Must be a VoiceDesign model."),
            "text": speech_text_input(),
            "instruct": text_input("The voice to design, in words: e.g. 'A warm, calm female voice in her "
                                   "thirties, speaking clearly at a relaxed pace.'",
                                   "A warm, calm female voice in her thirties, speaking clearly at a relaxed pace."),
            **generation_inputs(),
            "split_long_text": SPLIT_LONG_TEXT_INPUT,
        }}

    def generate(self, model, text, instruct, split_long_text=True, **options):
        language, settings = split_generation_options(options)
        return (run_generation(model, lambda tts, on_step: tts.voice_design(
            text, instruct, language=language, settings=settings, on_step=on_step, who=self.DISPLAY_NAME,
            split_long_text=split_long_text), self.DISPLAY_NAME, settings, text, instruct=instruct),)
