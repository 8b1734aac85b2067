"""The server's routes, run by cli.py serve with uvicorn; each passes lifecycle.Gate, every error is api_error's."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
from fastapi import FastAPI, File, Form, Request, UploadFile, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from ..engine.process import EngineProcess, ModelInfo, make_voice
from ..errors import Busy, EngineFailed
from ..lines.line import Line
from ..settings import LIVE_MAX_FRAMES, LIVE_MAX_PROMPT, LIVE_WIDTH, GenerationSettings
from .lifecycle import GRACE_S, Gate, Lifecycle, quiet_uvicorn
from .live_text import live_text
from .metrics import Metrics
from .protocol import ApiError, SpeechRequest, api_error
from .speech import Speech
from .voices import VoiceFolder, check_name

log = logging.getLogger(__name__)

WARM_TEXT = "Hello, this is a warm-up."
WARM_FRAMES = 24  # frames of the warm-up request: enough to run every step the first audio needs


def create_app(load, voices_dir: Path, api_key: str | None = None, model_id: str | None = None,
               defaults: GenerationSettings | None = None, width: int = LIVE_WIDTH,
               max_frames: int = LIVE_MAX_FRAMES, max_prompt: int = LIVE_MAX_PROMPT,
               max_waiting: int | None = None, kv_cache_bytes: int | None = None) -> FastAPI:
    """The app over the model `load()` (picklable) makes in the engine's process, which starts with the app, again
    when it ends (lifecycle.py says how often), and stops with it."""
    voices, metrics, lifecycle = VoiceFolder(voices_dir), Metrics(), Lifecycle()
    quiet_uvicorn()
    defaults = (defaults or GenerationSettings()).validate("cli.py serve")
    created = int(time.time())

    def ended(error: Exception) -> None:  # on the ended process's reader thread, which has nothing more to do
        while lifecycle.engine_ended(str(error)):
            try:
                info = engine.start()
            except Exception as e:  # it ended again while loading
                error = e
                continue
            try:
                _warm_up(info, engine, defaults)
            except Exception as e:
                return _warmed(lifecycle, e)
            return _warmed(lifecycle, None)

    engine = EngineProcess(load, dict(width=width, max_frames=max_frames, max_prompt=max_prompt,
                                      max_waiting=max_waiting, kv_cache_bytes=kv_cache_bytes), on_exit=ended)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            info = await asyncio.to_thread(engine.start)
        except Exception as e:  # the model did not load: the process exits 1 (lifecycle.run_server)
            lifecycle.fail(str(e))
            raise
        app.state.model = {"id": model_id or Path(info.source).name, "object": "model", "created": created,
                           "owned_by": "qwen3-tts-morph", "task_type": info.variant}  # OpenAI's model object
        app.state.speech = Speech(info, engine, voices, defaults, metrics)
        warm = asyncio.get_running_loop().run_in_executor(None, _warm_up, info, engine, defaults)
        warm.add_done_callback(lambda f: f.cancelled() or _warmed(lifecycle, f.exception()))  # cancelled: stopped first
        try:
            yield
        finally:  # what a drain left (the warm-up, a request whose client is still being answered) ends now
            engine.abort(RuntimeError("serve: the server stopped before this request finished"))
            await asyncio.to_thread(engine.close, GRACE_S)

    app = FastAPI(title="Qwen3-TTS Morph", lifespan=lifespan)
    app.state.lifecycle = lifecycle
    app.add_middleware(Gate, lifecycle=lifecycle, api_key=api_key)

    async def error_reply(request: Request, error: Exception) -> JSONResponse:
        return api_error(error, request.method, request.url.path, request.headers.get("content-type")).response()

    # each kind by name, so FastAPI's own {"detail": ...} handlers are not used; Exception (a bug) is also logged
    for kind in (ApiError, RequestValidationError, HTTPException, Busy, EngineFailed, Exception):
        app.add_exception_handler(kind, error_reply)

    @app.post("/v1/audio/speech")
    async def speech(body: SpeechRequest, request: Request):
        return await request.app.state.speech.reply(body, request)

    @app.websocket("/v1/audio/speech/stream")
    async def speech_stream(websocket: WebSocket):
        await live_text(websocket, websocket.app.state.speech)

    @app.post("/v1/audio/voices")
    async def add_voice(request: Request, audio_sample: UploadFile = File(...), name: str = Form(...),
                        ref_text: str | None = Form(None), x_vector_only_mode: bool = Form(False)):
        try:
            name = check_name(name)
        except ValueError as e:
            raise ApiError(400, str(e), "name", "invalid_value") from None
        try:  # the name is held while the voice is made: a second upload of it is refused now, not saved over it
            with voices.reserve(name):
                voice = await request.app.state.speech.make_voice(await audio_sample.read(), "audio_sample", ref_text,
                                                                  x_vector_only_mode)
                record = await asyncio.to_thread(voices.save, name, voice)
        except FileExistsError:
            raise ApiError(409, f"name: a voice named {name!r} exists, or is being made from another upload; DELETE "
                                f"/v1/audio/voices/{name} first, or choose another name", "name",
                           "voice_exists") from None
        return _voice_object(record)

    @app.get("/v1/audio/voices")
    async def list_voices(request: Request):
        saved = [_voice_object(r) for r in voices.records()]
        builtin = [{"object": "voice", "id": s, "name": s, "builtin": True}
                   for s in request.app.state.speech.info.speakers]
        return {"object": "list", "data": saved + builtin}

    @app.delete("/v1/audio/voices/{name}")
    async def delete_voice(name: str):
        try:
            gone = voices.delete(check_name(name))
        except ValueError as e:
            raise ApiError(400, str(e), "name", "invalid_value") from None
        if not gone:
            raise ApiError(404, f"name: no saved voice named {name!r}", "name", "voice_not_found")
        return {"object": "voice", "id": name, "deleted": True}

    @app.get("/v1/models")
    async def models(request: Request):
        return {"object": "list", "data": [request.app.state.model]}

    @app.get("/v1/models/{name:path}")  # a path: a --model-name may hold a "/", as Hugging Face's ids do
    async def one_model(name: str, request: Request):
        model = request.app.state.model
        if name != model["id"]:
            raise ApiError(404, f"The model {name!r} does not exist; this server serves {model['id']!r} (GET "
                                "/v1/models)", None, "model_not_found")
        return model

    @app.get("/health")
    async def health():
        status, body = lifecycle.health()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics_text():
        try:
            stats = await asyncio.to_thread(engine.stats)
        except EngineFailed:  # no engine process runs (restarting): its gauges read 0, the counters are the server's
            stats = dict(rows_live=0, rows_waiting=0, width=width, cache_slots=0)
        return PlainTextResponse(metrics.text(stats), media_type="text/plain; version=0.0.4")

    return app


def _voice_object(record: dict) -> dict:
    return {"object": "voice", "id": record["name"], **record}


def _warmed(lifecycle: Lifecycle, error: BaseException | None) -> None:
    """The warm-up's end, `error` None when it ran: the server serves, or has failed."""
    if error is None:
        lifecycle.ready()
    elif not isinstance(error, EngineFailed):  # else the engine's process ended, and is started again (create_app)
        lifecycle.fail(f"the warm-up request failed: {error}")


def _warm_up(info: ModelInfo, engine: EngineProcess, defaults: GenerationSettings) -> None:
    """One short request (on a worker thread), so the first client's does not pay for building the batch."""
    if info.variant == "base":
        noise = np.random.default_rng(0).normal(0, 0.1, 24000).astype(np.float32)
        voice = engine.call(make_voice, noise, 24000, x_vector_only=True, who="warm-up").result()
        line = Line(WARM_TEXT, voice)
    elif info.variant == "custom_voice":
        line = Line(WARM_TEXT, speaker=info.speakers[0])
    else:
        line = Line(WARM_TEXT, instruct="A calm voice.")
    done, errors = threading.Event(), []
    engine.submit(line, dataclasses.replace(defaults, max_new_tokens=WARM_FRAMES),
                  lambda wav: None, lambda error: (errors.append(error), done.set()), who="warm-up").result()
    done.wait()
    if errors[0] is not None:
        raise errors[0]
    log.info("serve: warm")
