"""POST /v1/audio/speech: a request's line, voice and settings, its run in the engine's process, and its audio at its
`speed`, streamed as it is made or as one file (docs/serving.md, Replies). A stream's status goes out before its audio,
so a later failure cuts it off (its chunked body never ends) rather than ending it as if whole."""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import functools
import hashlib
import json
import logging
import time

import numpy as np
from fastapi import Request as HttpRequest
from fastapi.responses import Response, StreamingResponse

from ..engine.process import EngineProcess, ModelInfo, make_voice
from ..errors import Busy, reason
from ..lines.line import Line
from ..qwen.checkpoints import VARIANT_NAMES
from ..settings import FRAMES_PER_SECOND, SAMPLE_RATE, GenerationSettings, Sampling
from .audio_io import FORMATS, STREAMABLE, StreamEncoder, decode_base64_audio, encode, media_type, read_audio
from .metrics import Metrics
from .protocol import TASKS, ApiError, CutOff, SpeechRequest, api_error
from .tempo import Stretch, stretched
from .voices import VoiceFolder

log = logging.getLogger(__name__)

WHO = "POST /v1/audio/speech"
DEFAULT_FORMAT = "mp3" if "mp3" in FORMATS else "wav"
REF_CACHE = 32  # voices made from a request's ref_audio, kept for the next request that sends the same clip
LISTED = 10  # saved voices an unknown voice's error names; the rest are counted


@dataclasses.dataclass
class _End:
    """The last item of a request's queue: `error` None when whole, else the error that stopped it."""

    error: BaseException | None


_GONE = _End(None)  # the last item of a whole-file request's queue when its client went away


class Speech:
    """Speech requests on one loaded model (module docstring)."""

    def __init__(self, info: ModelInfo, engine: EngineProcess, voices: VoiceFolder, defaults: GenerationSettings,
                 metrics: Metrics):
        self.info, self.engine, self.voices, self.defaults, self.metrics = info, engine, voices, defaults, metrics
        self._refs: collections.OrderedDict[bytes, bytes] = collections.OrderedDict()  # key: the voice's file

    async def reply(self, body: SpeechRequest, http: HttpRequest) -> Response:
        started = time.perf_counter()
        sse = body.stream_format == "sse"
        fmt = body.response_format or ("pcm" if sse else DEFAULT_FORMAT)
        if fmt not in FORMATS:
            raise ApiError(400, f"response_format: {fmt!r} cannot be encoded here; use one of {', '.join(FORMATS)}",
                           "response_format", "unsupported_format")
        if sse and fmt != "pcm":
            raise ApiError(400, "response_format: stream_format 'sse' sends base64 PCM; send response_format 'pcm'",
                           "response_format", "unsupported_format")
        settings = self.settings_of(body)
        request, items = await self.submit(await self.line_of(body), settings, WHO)
        if sse or (fmt in STREAMABLE and body.stream is not False):
            return StreamingResponse(self.stream(request, items, fmt, sse, body.speed, started, body.input, WHO),
                                     media_type="text/event-stream" if sse else media_type(fmt))
        return await self._whole(request, items, fmt, body.speed, http, started)

    async def submit(self, line: Line, settings: GenerationSettings, who: str) -> tuple[int, asyncio.Queue]:
        """Queue a line in the engine: its request's id, and the queue its audio chunks arrive on (then an _End)."""
        items = asyncio.Queue()
        # called on the thread that reads the engine process's records
        put = functools.partial(asyncio.get_running_loop().call_soon_threadsafe, items.put_nowait)
        try:
            request = await asyncio.wrap_future(self.engine.submit(line, settings, put, lambda error: put(_End(error)),
                                                                   who=who))
        except Busy:
            self.metrics.count("busy")
            raise
        except ValueError as e:
            raise ApiError(400, str(e), None, "invalid_value")
        return request, items

    async def line_of(self, body: SpeechRequest) -> Line:
        tts = self.info
        task = TASKS.get(body.task_type) if body.task_type else tts.variant
        if task != tts.variant:
            raise ApiError(400, f"task_type: this server's model ({tts.source}) is a {VARIANT_NAMES[tts.variant]} "
                                f"model, which cannot do {body.task_type}; send task_type "
                                f"{next(k for k, v in TASKS.items() if v == tts.variant)} or leave it out",
                           "task_type", "unsupported_task")
        language = next((x for x in tts.languages if x.lower() == body.language.lower()), None)
        if language is None:
            raise ApiError(400, f"language: {body.language!r} is not supported by this model; use one of "
                                f"{', '.join(tts.languages)}", "language", "invalid_value")
        _refuse_unused(body, task, tts.model_size)
        name = body.voice_name
        if task == "voice_design":  # `voice` is not read: OpenAI's clients must send one
            if not body.instructions.strip():
                raise ApiError(400, "instructions: a VoiceDesign model speaks in the voice the instructions describe; "
                                    "describe one", "instructions", "invalid_value")
            return Line(body.input, None, language, instruct=body.instructions)
        if task == "custom_voice":
            speaker = next((s for s in tts.speakers if s.lower() == (name or "").lower()), None)
            if speaker is None:
                raise ApiError(400, f"voice: {name!r} is not a speaker of this model; use one of "
                                    f"{', '.join(tts.speakers)}", "voice", "voice_not_found")
            return Line(body.input, None, language, speaker=speaker, instruct=body.instructions)
        if body.ref_audio:
            voice = await self.voice_from_ref(body.ref_audio, body.ref_text, body.x_vector_only_mode)
        elif name:
            voice = self.saved_voice(name)
        else:
            raise ApiError(400, "voice: send the name of a saved voice (POST /v1/audio/voices makes one) or the "
                                "reference clip as ref_audio", "voice", "invalid_value")
        return Line(body.input, voice, language)

    def settings_of(self, body: SpeechRequest) -> GenerationSettings:
        """The server's settings with the request's own (its sampling for talker and code predictor alike)."""
        if body.max_new_tokens is not None and body.max_new_tokens > self.engine.max_frames:
            raise ApiError(400, f"max_new_tokens: {body.max_new_tokens} frames is over this server's limit; send at "
                                f"most {self.engine.max_frames} (cli.py serve --max-frames sets it)",
                           "max_new_tokens", "invalid_value")
        d, sub = self.defaults, self.defaults.subtalker
        temperature = d.temperature if body.temperature is None else body.temperature
        top_k = d.top_k if body.top_k is None else body.top_k
        top_p = d.top_p if body.top_p is None else body.top_p
        return dataclasses.replace(
            d, seq_groups=body.seq_groups or d.seq_groups, temperature=temperature, top_k=top_k, top_p=top_p,
            subtalker=Sampling(sub.do_sample, temperature, top_k, top_p),
            seed=d.seed if body.seed is None else body.seed,
            max_new_tokens=body.max_new_tokens or d.max_new_tokens)

    def saved_voice(self, name: str) -> bytes:
        try:
            return self.voices.load(name)
        except KeyError:
            names = self.voices.names()
            saved = ", ".join(names[:LISTED]) + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")
            raise ApiError(400, f"voice: no saved voice named {name!r} (saved: {saved or 'none'}); use one of those, "
                                "register one with POST /v1/audio/voices, or send the clip as ref_audio", "voice",
                           "voice_not_found") from None
        except ValueError as e:  # a name that cannot be a file, or a file that is not a voice
            raise ApiError(400, f"voice: {e}", "voice", "invalid_value") from None

    async def voice_from_ref(self, ref_audio: str, ref_text: str | None, x_vector_only: bool) -> bytes:
        try:
            data = decode_base64_audio(ref_audio, "ref_audio")
        except ValueError as e:
            raise ApiError(400, str(e), "ref_audio", "invalid_value") from None
        key = hashlib.blake2b(data + json.dumps([ref_text, x_vector_only]).encode(), digest_size=16).digest()
        if key in self._refs:  # the event loop's alone: no lock
            self._refs.move_to_end(key)
            return self._refs[key]
        voice = self._refs[key] = await self.make_voice(data, "ref_audio", ref_text, x_vector_only)
        if len(self._refs) > REF_CACHE:
            self._refs.popitem(last=False)
        return voice

    async def make_voice(self, data: bytes, field: str, ref_text: str | None, x_vector_only: bool) -> bytes:
        """A voice (its file's bytes) from a clip's, made on the engine's thread, where the model runs alone."""
        try:
            wave, rate = await asyncio.to_thread(read_audio, data, field)
            return await asyncio.wrap_future(self.engine.call(make_voice, wave, rate, transcript=ref_text,
                                                              x_vector_only=x_vector_only, who=field))
        except ValueError as e:
            message = str(e)
            raise ApiError(400, message if message.startswith(field) else f"{field}: {message}", field,
                           "invalid_value") from None

    async def stream(self, request, items: asyncio.Queue, fmt: str, sse: bool, speed: float, started: float,
                     text: str, who: str):
        """A streamed reply's bytes as the request's audio comes; `started`: when it arrived, for /metrics."""
        samples, status = 0, "cancelled"  # samples: the model's, before the stretch

        def send(data: bytes) -> bytes:
            return _sse("speech.audio.delta", audio=base64.b64encode(data).decode()) if sse else data

        try:
            stretch, encoder = Stretch(speed), StreamEncoder("pcm" if sse else fmt)
            while not isinstance(item := await items.get(), _End):
                if samples == 0:
                    self.metrics.first_audio(time.perf_counter() - started)
                samples += item.size
                # on a worker thread, so the event loop serves the others
                if data := await asyncio.to_thread(lambda: encoder.feed(stretch.feed(item))):
                    yield send(data)  # an encoder still filling its first frame has nothing yet
            if item.error is not None:
                status = "error"
                log.warning("%s: a stream was cut off after %.2f s of audio: %s", who, samples / SAMPLE_RATE,
                            reason(item.error))
                raise CutOff(item.error)  # the client sees it unfinished, not whole
            if data := await asyncio.to_thread(lambda: encoder.feed(stretch.finish()) + encoder.finish()):
                yield send(data)
            if sse:  # the usage: the text's tokens in, the codec frames spoken out
                tokens = await asyncio.wrap_future(self.engine.count_tokens(text))
                frames = round(samples / SAMPLE_RATE * FRAMES_PER_SECOND)
                yield _sse("speech.audio.done", usage=dict(input_tokens=tokens, output_tokens=frames,
                                                           total_tokens=tokens + frames))
            status = "ok"
        finally:
            if status == "cancelled":  # its client went away (a WebSocket's: or its session ended)
                log.warning("%s: a stream stopped after %.2f s of audio, before its end: cancelled", who,
                            samples / SAMPLE_RATE)
            self.engine.cancel(request)  # nothing once it has ended; a client that went away frees its rows
            self.metrics.finished(status, samples / SAMPLE_RATE, time.perf_counter() - started)

    async def _whole(self, request, items: asyncio.Queue, fmt: str, speed: float, http: HttpRequest,
                     started: float) -> Response:
        chunks, status = [], "cancelled"
        gone = asyncio.create_task(_until_gone(http, items))
        try:
            while not isinstance(item := await items.get(), _End):
                if not chunks:
                    self.metrics.first_audio(time.perf_counter() - started)
                chunks.append(item)
            if item is _GONE:
                return Response(status_code=499)  # nobody reads it
            if item.error is not None:
                status = "error"
                raise api_error(item.error)
            audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
            # on a worker thread: a long clip's stretch and encoding would hold up every stream's chunks
            data = await asyncio.to_thread(lambda: encode(stretched(audio, speed), fmt))
            status = "ok"
            return Response(data, media_type=media_type(fmt))
        finally:
            gone.cancel()
            self.engine.cancel(request)  # nothing once it has ended; a client that went away frees its rows
            self.metrics.finished(status, sum(c.size for c in chunks) / SAMPLE_RATE, time.perf_counter() - started)


async def _until_gone(http: HttpRequest, items: asyncio.Queue) -> None:
    """End the request's queue once the client hangs up (its body is read: its next message is the disconnect)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass
    items.put_nowait(_GONE)


def _refuse_unused(body: SpeechRequest, task: str, model_size: str) -> None:
    """A field the loaded model would not use is refused, not dropped: a request must not seem to have done it."""
    cloning = {"ref_audio": body.ref_audio, "ref_text": body.ref_text, "x_vector_only_mode": body.x_vector_only_mode}
    if task != "base":
        speaks = "its own speakers" if task == "custom_voice" else "the voice its instructions describe"
        for field, value in cloning.items():
            if value:
                raise ApiError(400, f"{field}: this server's model speaks in {speaks}; cloning a clip needs a Base "
                                    "model", field, "invalid_value")
    elif body.instructions.strip():
        raise ApiError(400, "instructions: a Base (voice clone) model takes no instructions; leave them out, or load a "
                            "CustomVoice or VoiceDesign model", "instructions", "invalid_value")
    elif (body.ref_text or body.x_vector_only_mode) and not body.ref_audio:
        field = "ref_text" if body.ref_text else "x_vector_only_mode"
        raise ApiError(400, f"{field}: goes with ref_audio; a saved voice keeps its own transcript and mode", field,
                       "invalid_value")
    if task == "custom_voice" and model_size == "0b6" and body.instructions.strip():
        raise ApiError(400, "instructions: the 0.6B CustomVoice model was trained without instructions (upstream drops "
                            "them); leave them out, or load the 1.7B", "instructions", "invalid_value")


def _sse(kind: str, **fields) -> bytes:
    return f"data: {json.dumps({'type': kind, **fields})}\n\n".encode()
