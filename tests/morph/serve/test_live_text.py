"""WS /v1/audio/speech/stream (morph/serve/live_text.py) over a real server (tiny model, CPU) with the `websockets`
client: text typed a few characters at a time is spoken sentence by sentence, in order, each sentence's audio what
POST gives for it with the same seed; input.done speaks what is left; a client that goes away leaves the engine idle;
every error names its field or problem, with its close code and no error in the server's log (text that is no text is
checked as POST checks it: close 1007); the key is checked at the handshake, whose refusal is no error in the log. And
the sentence cutting, on strings."""

from __future__ import annotations

import contextlib
import json
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from morph.serve.live_text import Sentences
from tests.audio_compare import assert_audio_close

from tests.serve_faults import hold

from .conftest import API_KEY, no_errors, serving
from .test_app import AUTH, from_pcm, save_alice, wav_bytes

FRAMES = 12
CONFIG = {"type": "session.config", "voice": "alice", "seed": 5, "max_new_tokens": FRAMES}


@pytest.mark.parametrize("typed,sentences,rest", [
    ("Hello there. How are", ["Hello there."], ["How are"]),
    ("It is 3.14 now! Ok", ["It is 3.14 now!"], ["Ok"]),  # a mark with no space after it ends nothing
    ("Wait.", [], ["Wait."]),  # not yet: the next character may be a digit
    ('He said "Stop." Then', ['He said "Stop."'], ["Then"]),
    ("One; two\nthree", ["One;", "two"], ["three"]),
    ("你好。再见", ["你好。"], ["再见"]),
    ("", [], []),
])
def test_sentences_end_once_their_mark_is_followed(typed, sentences, rest):
    for step in (1, 3, len(typed) or 1):  # however the text is cut into messages
        cutter = Sentences()
        got = [s for i in range(0, len(typed), step) for s in cutter.feed(typed[i:i + step])]
        assert got == sentences and cutter.finish() == rest, step


def test_a_run_on_text_is_cut_at_the_cap_where_a_clause_or_word_ends():
    cutter = Sentences(cap=20)
    assert cutter.feed("one two three four five six") == ["one two three four"]
    assert cutter.feed(" seven, eight nine ten") == ["five six seven,"]
    assert cutter.finish() == ["eight nine ten"]
    assert Sentences(cap=4).feed("abcdefghij") == ["abcd", "efgh"]  # no space: cut at the cap
    words = "word " * 100
    pieces = Sentences(cap=30).feed(words) + Sentences(cap=30).finish()
    assert all(len(p) <= 30 for p in pieces)


@pytest.fixture
def alice_url(server):
    """The server's URL, with test_app.py's voice alice saved there."""
    save_alice(server[0])
    return server[0]


def ws_url(url: str, query: str = "") -> str:
    return url.replace("http://", "ws://") + "/v1/audio/speech/stream" + query


@contextlib.contextmanager
def open_session(url: str, **config):
    with connect(ws_url(url), additional_headers=AUTH, open_timeout=30) as ws:
        ws.send(json.dumps({**CONFIG, **config}))
        yield ws


def type_text(ws, text: str, step: int = 3) -> None:
    for i in range(0, len(text), step):
        ws.send(json.dumps({"type": "input.text", "text": text[i:i + step]}))


def read_sentence(ws) -> tuple[dict, bytes, dict]:
    """One sentence's audio.start, its audio, its audio.done."""
    start, audio = json.loads(ws.recv(timeout=60)), b""
    assert start["type"] == "audio.start", start
    while isinstance(message := ws.recv(timeout=60), bytes):
        audio += message
    done = json.loads(message)
    assert done == {"type": "audio.done", "sentence_index": start["sentence_index"], "total_bytes": len(audio)}
    return start, audio, done


def test_typed_text_is_spoken_sentence_by_sentence_as_post_speaks_each(alice_url):
    url = alice_url
    with open_session(url) as ws:
        type_text(ws, "Hello there. How")
        first = read_sentence(ws)  # spoken while the text is still being typed
        type_text(ws, " are you today? Fine")
        ws.send(json.dumps({"type": "input.done"}))  # speaks "Fine", which has no end mark
        sentences = [first, read_sentence(ws), read_sentence(ws)]
        assert json.loads(ws.recv(timeout=60)) == {"type": "session.done", "total_sentences": 3}
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)  # the server closed
        assert ws.close_code == 1000
    texts = ["Hello there.", "How are you today?", "Fine"]
    for index, (start, audio, _) in enumerate(sentences):
        assert start == {"type": "audio.start", "sentence_index": index, "sentence_text": texts[index],
                         "format": "pcm", "sample_rate": 24000}
        post = httpx.post(f"{url}/v1/audio/speech", headers=AUTH, timeout=60, json={
            "input": texts[index], "voice": "alice", "response_format": "pcm", "seed": 5, "max_new_tokens": FRAMES})
        assert len(audio) > 0
        assert_audio_close(from_pcm(audio), from_pcm(post.content), rel=1e-3)


def test_each_sentence_is_a_stream_of_its_own_format(alice_url):
    with open_session(alice_url, response_format="wav", max_new_tokens=6) as ws:
        type_text(ws, "One. Two.", step=100)
        ws.send(json.dumps({"type": "input.done"}))
        for _ in range(2):
            start, audio, _ = read_sentence(ws)
            assert start["format"] == "wav" and audio[:4] == b"RIFF" and len(audio) > 44
        assert json.loads(ws.recv(timeout=60))["total_sentences"] == 2


def test_a_client_that_goes_away_leaves_the_engine_idle(alice_url, server):
    url, app = server
    engine = app.state.speech.engine
    with open_session(url, max_new_tokens=400) as ws:
        type_text(ws, "A long first sentence to speak. And a second one after it. And a third.", step=20)
        assert json.loads(ws.recv(timeout=60))["type"] == "audio.start"
        assert isinstance(ws.recv(timeout=60), bytes)  # the first sentence is streaming, the second made ahead
        stats = engine.stats()
        assert stats["rows_in_batch"] + stats["rows_waiting"] == 2  # not the third, which has no end yet
        assert app.state.lifecycle.active == 1  # the session is in flight, for a drain to wait on
    deadline = time.monotonic() + 30
    while (engine.stats()["rows_in_batch"] or engine.stats()["rows_waiting"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["rows_in_batch"] == engine.stats()["rows_waiting"] == 0
    assert app.state.lifecycle.active == 0
    assert 'morph_requests_total{status="cancelled"} 2' in httpx.get(f"{url}/metrics", headers=AUTH).text


SURROGATE = '"Hi \\ud800 there. "'  # a JSON string with the escape of a lone surrogate, as a client may send it
ERRORS = [  # (messages after the handshake, code, param, words in the message, close code)
    ([{"type": "input.text", "text": "Hi."}], "expected_session_config", "type", "session.config", 1008),
    ([{**CONFIG, "voice": "nobody"}], "voice_not_found", "voice", "nobody", 1008),
    ([{**CONFIG, "response_format": "flac"}], "unsupported_format", "response_format", "flac", 1008),
    ([{**CONFIG, "speed": 9}], "invalid_value", "speed", "4", 1008),
    ([{**CONFIG, "speed": True}], "invalid_value", "speed", "valid number, not true", 1008),
    ([{**CONFIG, "max_new_tokens": 401}], "invalid_value", "max_new_tokens", "at most 400", 1008),
    ([CONFIG, {"type": "input.audio"}], "unknown_type", "type", "input.audio", 1008),
    ([CONFIG, {"type": "input.text", "text": "x" * 4097}], "invalid_value", "text", "4096", 1008),
    ([CONFIG, {"type": "input.text", "text": 3}], "invalid_value", "text", "string", 1008),
    ([CONFIG, CONFIG], "unexpected_message", "type", "twice", 1008),
    (["not json"], "invalid_json", None, "JSON", 1008),
    ([CONFIG, '{"type": "input.text", "text": %s}' % SURROGATE], "invalid_text", "text",
     "text: character 3 ('\\ud800') is not valid Unicode text (a lone surrogate); send the text as UTF-8", 1007),
    ([CONFIG, {"type": "input.text", "text": "Fine. "}, '{"type": "input.text", "text": %s}' % SURROGATE],
     "invalid_text", "text", "lone surrogate", 1007),  # while a sentence is in the engine
    (['{"type": "session.config", "voice": "alice", "language": %s}' % SURROGATE], "invalid_text", "language",
     "lone surrogate", 1007),
]


def test_every_error_names_its_problem_and_closes(alice_url, server_log):
    for messages, code, param, words, close in ERRORS:
        with connect(ws_url(alice_url), additional_headers=AUTH) as ws:
            for message in messages:
                ws.send(message if isinstance(message, str) else json.dumps(message))
            while isinstance(reply := ws.recv(timeout=60), bytes) or json.loads(reply)["type"] != "error":
                pass  # a sentence's audio that went out before the error
            error = json.loads(reply)
            assert (error["code"], error["param"]) == (code, param), error
            assert words in error["message"], error
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)
            assert ws.close_code == close, (messages, ws.close_code)
    no_errors(server_log)  # the client's mistakes: no traceback (the tokenizer's, once, for a lone surrogate)


def test_a_full_queue_ends_the_session_busy(lean, tmp_path, ref_audio):
    """While the engine's thread is held, one row may wait: the session's first sentence waits, its second (one
    ahead) is refused, and the session ends with that error, busy."""
    with serving(lean, tmp_path / "voices", max_waiting=1) as (url, app):
        made = httpx.post(f"{url}/v1/audio/voices", headers=AUTH, data={"name": "alice"},
                          files={"audio_sample": ("a.wav", wav_bytes(ref_audio[0]), "audio/wav")}, timeout=60)
        assert made.status_code == 200, made.text
        engine, gate = app.state.speech.engine, tmp_path / "go"
        held = engine.call(hold, str(gate))
        try:
            with open_session(url) as ws:
                type_text(ws, "Hello there. How are you? ", step=100)
                events = []
                while not events or events[-1]["type"] != "error":  # the first sentence's audio.start may come first
                    message = ws.recv(timeout=60)
                    if isinstance(message, str):
                        events.append(json.loads(message))
                error = events[-1]
                assert error["code"] == "server_busy" and "try again in" in error["message"]
                assert [e["type"] for e in events[:-1]] in ([], ["audio.start"])
                with pytest.raises(ConnectionClosed):
                    ws.recv(timeout=10)
                assert ws.close_code == 1013
        finally:
            gate.touch()
            held.result(60)
def test_the_key_is_checked_at_the_handshake_and_a_draining_server_refuses(server, server_log):
    """Refused with an HTTP answer: 401 naming the scheme, 503 while draining; neither is an error in the log
    (uvicorn's own record of a refused handshake, an ERROR, is left out)."""
    url, app = server
    for headers, query in (({}, ""), ({"Authorization": "Bearer wrong"}, ""), ({}, "?api_key=wrong")):
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url(url, query), additional_headers=headers, open_timeout=30)
        assert refused.value.response.status_code == 401
        assert refused.value.response.headers["WWW-Authenticate"] == "Bearer"
        assert json.loads(refused.value.response.body)["error"]["code"] == "invalid_api_key"
    for headers, query in ((AUTH, ""), ({}, f"?api_key={API_KEY}")):  # a browser sends it in the query
        with connect(ws_url(url, query), additional_headers=headers, open_timeout=30) as ws:
            ws.send(json.dumps({"type": "input.done"}))
            assert json.loads(ws.recv(timeout=60))["code"] == "expected_session_config"
    app.state.lifecycle.drain()
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(url), additional_headers=AUTH, open_timeout=30)
    assert refused.value.response.status_code == 503
    no_errors(server_log)
