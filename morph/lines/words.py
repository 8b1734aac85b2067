"""How each front end (Python API, nodes, CLI) words the same fix in a message; a front end passes its `Words` with
the call, so a CLI user never reads a node's name and a node user never a flag."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Words:
    new_clip: str  # give another reference clip
    no_transcript: str  # clone without the transcript (x-vector only)
    transcript: str  # where the words of the reference clip go
    make_voice: str  # how a saved voice file is made
    add_names: str  # how a script's missing character gets a voice
    prefix: str  # the name of the option that says where a script's files go
    other_disk: str  # how a script's files go to another disk


FOR_PYTHON = Words(
    new_clip="pass a recording of the voice to clone",
    no_transcript="pass no transcript (or x_vector_only=True)",
    transcript="the transcript argument of make_voice",
    make_voice="make it with MorphTTS.make_voice and morph.lines.voice.save_voice",
    add_names="give the missing character a voice",
    prefix="prefix",
    other_disk="give the job an output folder on another disk",
)
FOR_NODES = Words(
    new_clip="connect a recording of the voice to clone",
    no_transcript="clear the transcript (or turn on x_vector_only)",
    transcript="the Voice prompt's transcript",
    make_voice="make it with the Voice prompt node and save it with the Save Voice node",
    add_names="add a Voice Bank node for each missing character",
    prefix="filename_prefix",
    other_disk="start ComfyUI with its output folder on another disk (its output-directory option)",
)
FOR_CLI = Words(
    new_clip="give --voice a recording of the voice to clone",
    no_transcript="leave out --transcript",
    transcript="--transcript",
    make_voice="make it with: python cli.py voice save CLIP --transcript TEXT --out NAME.safetensors",
    add_names="give the missing character a --voice, --speaker or --design",
    prefix="--prefix",
    other_disk="give --out a folder on another disk",
)

_SIZES = {"0b6": "0.6B", "1b7": "1.7B"}  # checkpoints' tts_model_size -> how the model cards write it


def model_size_name(size: str) -> str:
    """A checkpoint's size as users write it: '0b6' -> '0.6B'; an unknown one as it is."""
    return _SIZES.get(str(size).lower(), str(size) or "unknown")
