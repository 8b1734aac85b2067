"""The server on the other model variants (tiny models, CPU, mode "lean"): a CustomVoice model speaks its built-in
speakers by `voice` and lists them, a VoiceDesign model the voice its `instructions` describe; a field the loaded model
would not use (a clip to clone, instructions where none are taken) is refused with a 400 naming it."""

from __future__ import annotations

import httpx
import pytest

from morph.api import MorphTTS

from .conftest import API_KEY, serving

AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module", params=["custom_voice", "voice_design"])
def variant(request, model_dirs):
    tts = MorphTTS.load(str(model_dirs("tiny", request.param)), device="cpu", dtype="fp32", attention="sdpa",
                        mode="lean")
    return request.param, tts


def speak(url, **fields):
    body = {"model": "qwen3-tts", "input": "Hello there, how are you?", "response_format": "pcm",
            "max_new_tokens": 8, **fields}
    return httpx.post(f"{url}/v1/audio/speech", headers=AUTH, json=body, timeout=60)


def test_each_variant_speaks_and_refuses_what_it_cannot_use(variant, tmp_path):
    kind, tts = variant
    with serving(tts, tmp_path / "voices") as (url, _):
        listed = [v["id"] for v in httpx.get(f"{url}/v1/audio/voices", headers=AUTH).json()["data"]]
        assert httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]["task_type"] == kind
        if kind == "custom_voice":
            assert listed == tts.speakers
            ok = speak(url, voice=tts.speakers[0].upper())  # speaker names match whatever their case
            unknown = speak(url, voice="nobody")
            assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "voice"
        else:
            assert listed == []
            ok = speak(url, voice="alloy", instructions="A calm, low voice.")  # voice is not read: clients send one
            missing = speak(url, voice="alloy")
            assert missing.status_code == 400 and missing.json()["error"]["param"] == "instructions"
        assert ok.status_code == 200 and len(ok.content) > 0
        clone = speak(url, voice="alloy", ref_audio="UklGRg==")
        assert clone.status_code == 400 and "needs a Base model" in clone.json()["error"]["message"]
        task = speak(url, voice="alloy", task_type="Base")
        assert task.status_code == 400 and task.json()["error"]["param"] == "task_type"
