"""What POST /v1/audio/speech answers without a model (morph/serve/speech.py): an unknown voice's error names the
saved voices, the first LISTED of them, and counts the rest. The same over real HTTP: test_app.py."""

from __future__ import annotations

import pytest

from morph.serve.protocol import ApiError
from morph.serve.speech import LISTED, Speech
from morph.serve.voices import VoiceFolder

from .test_voices import xvector_voice


def refusal(folder: VoiceFolder, name: str) -> ApiError:
    speech = Speech(None, None, folder, None, None)  # saved_voice reads the folder alone
    with pytest.raises(ApiError) as e:
        speech.saved_voice(name)
    return e.value


def test_an_unknown_voice_lists_the_saved_ones_bounded(tmp_path):
    folder = VoiceFolder(tmp_path)
    error = refusal(folder, "nobody")
    assert (error.status, error.param, error.code) == (400, "voice", "voice_not_found")
    assert error.message == ("voice: no saved voice named 'nobody' (saved: none); use one of those, register one with "
                             "POST /v1/audio/voices, or send the clip as ref_audio")
    names = [f"v{i:02d}" for i in range(LISTED + 2)]
    for name in reversed(names):
        folder.save(name, xvector_voice())
    assert LISTED == 10
    assert refusal(folder, "nobody").message.startswith(
        f"voice: no saved voice named 'nobody' (saved: {', '.join(names[:LISTED])} and 2 more); use one of those")
    folder.delete("v11")
    assert f"(saved: {', '.join(names[:LISTED])} and 1 more)" in refusal(folder, "v11").message
    folder.delete("v10")
    assert f"(saved: {', '.join(names[:LISTED])});" in refusal(folder, "v10").message  # exactly LISTED: all named
