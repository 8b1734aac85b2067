"""WS /v1/audio/speech/stream: text as it is typed in, each sentence's audio out as it is made, in vLLM-Omni's Qwen3-TTS
protocol (docs/serving.md, Text as it is typed). A sentence ends where lines/text_split.py ends one, once the white
space after its mark has come (not in "3.14"), or at MAX_SENTENCE_CHARS; each is a request."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import time

from fastapi import WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from ..lines.text_split import BOUNDARY, CLAUSE
from ..settings import SAMPLE_RATE
from .audio_io import STREAMABLE
from .protocol import MAX_INPUT_CHARS, ApiError, CutOff, NotText, SpeechRequest, api_error, check_text, \
    validation_error
from .speech import Speech

log = logging.getLogger(__name__)

WHO = "WS /v1/audio/speech/stream"
MAX_SENTENCE_CHARS = 200  # a text that runs on is cut where a clause or word ends, so it is heard while typed
# Sentences in the engine beyond the one streaming: the next is made while this one plays, and a text that comes
# faster than it is spoken does not take the batch's slots from the server's other clients
AHEAD = 1
_NO_TEXT = "."  # the config's text, never spoken: each sentence replaces it


class Sentences:
    """`feed` the next characters and get the sentences they complete, `finish` for the rest."""

    def __init__(self, cap: int = MAX_SENTENCE_CHARS):
        self.cap, self._open = cap, ""

    def feed(self, text: str) -> list[str]:
        *ended, self._open = BOUNDARY.split(self._open + text)  # the last piece has no end yet
        out = []
        for sentence in ended:
            pieces, rest = _run_on(sentence.strip(), self.cap)
            out += [*pieces, rest]
        pieces, self._open = _run_on(self._open, self.cap)
        return [s for s in out + pieces if s]

    def finish(self) -> list[str]:
        return self.feed("\n")  # a line break ends a sentence


def _run_on(text: str, cap: int) -> tuple[list[str], str]:
    """Pieces of at most `cap` characters cut off `text` (after a clause mark, else a space), and what is left."""
    pieces = []
    while len(text) > cap:
        clause = max((m.end() for m in CLAUSE.finditer(text, 0, cap)), default=0)
        space = text.rfind(" ", 0, cap + 1)
        cut = clause or (space if space > 0 else cap)
        pieces.append(text[:cut].strip())
        text = text[cut:].lstrip()
    return pieces, text


@dataclasses.dataclass
class _Sentence:
    index: int
    text: str
    request: int  # its id in the engine (Speech.submit)
    items: asyncio.Queue  # its audio chunks as the engine makes them (Speech.submit)
    started: float


async def live_text(ws: WebSocket, speech: Speech) -> None:
    """One session, from the accept to the close."""
    await ws.accept()
    session = _Session(ws, speech)
    try:
        await session.run()
    except WebSocketDisconnect:
        pass  # the client went away: its sentences are cancelled below
    except Exception as e:  # every failure is answered, in the protocol's shape
        error = api_error(e.error if isinstance(e, CutOff) else e)  # a cut sentence's stream has logged why
        if error.status == 500 and not isinstance(e, (ApiError, CutOff)):  # a bug: its traceback is wanted
            log.error("%s: %s", WHO, error.message, exc_info=e)
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # a client that is gone hears nothing
            await ws.send_json({"type": "error", "message": error.message, "code": error.code, "param": error.param})
            await ws.close(_close_code(error))
    finally:
        session.cancel()


class _Session:
    """A session's state, the event loop's alone, shared by its reader (the client's messages) and sender (audio)."""

    def __init__(self, ws: WebSocket, speech: Speech):
        self.ws, self.speech = ws, speech
        self.waiting: collections.deque[str] = collections.deque()  # complete, not yet submitted
        self.queued: collections.deque[_Sentence] = collections.deque()  # submitted, not yet streaming
        self.streaming = False
        self.typing = True  # until input.done
        self.count = 0  # sentences submitted
        self.changed = asyncio.Event()
        # the reader and the sender both submit: one at a time, so sentences enter the engine and the queue in order
        self.submitting = asyncio.Lock()

    async def run(self) -> None:
        body = _config(await _receive(self.ws))
        self.fmt, self.speed = body.response_format or "pcm", body.speed
        if self.fmt not in STREAMABLE:
            raise ApiError(400, f"response_format: {self.fmt!r} is not streamed; each sentence streams, so use one of "
                                f"{', '.join(STREAMABLE)}", "response_format", "unsupported_format")
        self.settings = self.speech.settings_of(body)
        self.line = await self.speech.line_of(body)
        reader, sender = asyncio.create_task(self._read()), asyncio.create_task(self._send())
        try:  # until the sender has said session.done, or either fails (the reader only ever ends failing)
            done, _ = await asyncio.wait((reader, sender), return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            reader.cancel()
            sender.cancel()
            await asyncio.wait((reader, sender))  # stopped before the error goes out: nothing is sent after it

    async def _read(self) -> None:
        sentences = Sentences()
        while True:
            message = await _receive(self.ws)
            kind = message.get("type")
            if not self.typing:
                raise ApiError(400, f"type: {kind!r} came after input.done, which ends the session's text; open a new "
                                    "session for more", "type", "unexpected_message")
            if kind == "input.text":
                text = message.get("text")
                if not isinstance(text, str):
                    raise ApiError(400, "text: input.text carries its characters as a string", "text", "invalid_value")
                if len(text) > MAX_INPUT_CHARS:
                    raise ApiError(400, f"text: {len(text)} characters in one input.text, over the {MAX_INPUT_CHARS} "
                                        "a message takes; send it in several", "text", "invalid_value")
                try:  # as POST checks its input: the engine's tokenizer cannot take a lone surrogate
                    check_text(text)
                except NotText as e:
                    raise ApiError(400, f"text: {e}", "text", "invalid_text") from None
                await self._add(sentences.feed(text))
            elif kind == "input.done":
                await self._add(sentences.finish())
                self.typing = False
                self.changed.set()
            elif kind == "session.config":
                raise ApiError(400, "type: session.config came twice; a session has one, first", "type",
                               "unexpected_message")
            else:
                raise ApiError(400, f"type: {kind!r} is not a message of this route; send input.text or input.done",
                               "type", "unknown_type")

    async def _add(self, sentences: list[str]) -> None:
        self.waiting.extend(sentences)
        await self._submit()

    async def _submit(self) -> None:
        """Into the engine: the waiting sentences that have a place."""
        async with self.submitting:
            while self.waiting and len(self.queued) + self.streaming <= AHEAD:
                text = self.waiting.popleft()
                request, items = await self.speech.submit(dataclasses.replace(self.line, text=text), self.settings,
                                                          WHO)
                self.queued.append(_Sentence(self.count, text, request, items, time.perf_counter()))
                self.count += 1
                self.changed.set()

    async def _send(self) -> None:
        ws = self.ws
        while self.typing or self.waiting or self.queued:
            if not self.queued:
                self.changed.clear()
                await self.changed.wait()
                continue
            sentence = self.queued[0]
            await ws.send_json({"type": "audio.start", "sentence_index": sentence.index,
                                "sentence_text": sentence.text, "format": self.fmt, "sample_rate": SAMPLE_RATE})
            self.queued.popleft()  # from here its stream owns it
            self.streaming, total = True, 0
            chunks = self.speech.stream(sentence.request, sentence.items, self.fmt, False, self.speed,
                                        sentence.started, sentence.text, WHO)
            async with contextlib.aclosing(chunks):  # its end cancels the request and counts it, however it ends
                async for data in chunks:
                    await ws.send_bytes(data)
                    total += len(data)
            await ws.send_json({"type": "audio.done", "sentence_index": sentence.index, "total_bytes": total})
            self.streaming = False
            await self._submit()
        await ws.send_json({"type": "session.done", "total_sentences": self.count})
        await ws.close(1000)

    def cancel(self) -> None:
        """The sentences not yet streaming leave the engine, counted as cancelled (a streaming one's stream does)."""
        now = time.perf_counter()
        for sentence in self.queued:
            self.speech.engine.cancel(sentence.request)
            self.speech.metrics.finished("cancelled", 0.0, now - sentence.started)
        self.queued.clear()


def _close_code(error: ApiError) -> int:
    if error.code == "invalid_text":
        return 1007
    return 1008 if error.status < 500 else 1013 if error.status == 503 else 1011


async def _receive(ws: WebSocket) -> dict:
    """The client's next message, a JSON object."""
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000), message.get("reason"))
    if message.get("text") is None:
        raise ApiError(400, "the message is binary; send JSON objects as text frames", None, "invalid_json")
    try:
        value = json.loads(message["text"])
    except json.JSONDecodeError:
        raise ApiError(400, "the message is not valid JSON; send a JSON object", None, "invalid_json") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the message is not a JSON object; send one with a type", None, "invalid_json")
    return value


def _config(message: dict) -> SpeechRequest:
    """The session.config message as a speech body (its text comes in input.text messages)."""
    if message.get("type") != "session.config":
        raise ApiError(400, f"type: the first message must be session.config, not {message.get('type')!r}", "type",
                       "expected_session_config")
    try:
        return SpeechRequest.model_validate({**message, "input": _NO_TEXT})
    except ValidationError as e:
        raise validation_error(e.errors()) from None
