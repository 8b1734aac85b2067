"""What a speech request may say (docs/serving.md, Requests) and the errors the server answers with: every answer
other than audio is OpenAI's error shape, which `api_error` alone picks."""

from __future__ import annotations

import json
from typing import Literal

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.exceptions import HTTPException

from ..errors import Busy, EngineFailed
from ..settings import MAX_SEQ_GROUPS
from .tempo import MAX_SPEED, MIN_SPEED

MAX_INPUT_CHARS = 4096  # OpenAI's limit for one request
TASKS = {"Base": "base", "CustomVoice": "custom_voice", "VoiceDesign": "voice_design"}
# the types each route reads its body as, and how to send it (FastAPI reads a body of another type as no body at all)
BODY_TYPES = {"/v1/audio/speech": (("application/json",), "JSON, with the header Content-Type: application/json"),
              "/v1/audio/voices": (("multipart/form-data", "application/x-www-form-urlencoded"),
                                   "a multipart form (curl -F name=... -F audio_sample=@clip.wav)")}


class ApiError(Exception):
    """An answer other than audio: HTTP status, OpenAI's error type and code, and the field it is about."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status, headers=self.headers)


class CutOff(Exception):
    """Raised out of a reply whose status has gone out, so the client sees it unfinished; `error` (logged) is why."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class NotText(ValueError):
    """A string that is no text (a lone surrogate): answered with the code `invalid_text`, and WebSocket close 1007."""


def check_text(value: str) -> str:
    """A lone surrogate ("\\ud800" in the JSON) is valid JSON but no text: the tokenizer cannot take it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise NotText(f"character {e.start} ({value[e.start]!r}) is not valid Unicode text (a lone surrogate); send "
                      "the text as UTF-8") from None
    return value


def api_error(error: BaseException, method: str = "", path: str = "", content_type: str | None = None) -> ApiError:
    """The answer to a request that `error` stopped: 4xx for its mistakes, 503 for what it may send again, else 500."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, RequestValidationError):
        takes, how = BODY_TYPES.get(path, ((), None))
        sent = (content_type or "").partition(";")[0].strip().lower()
        json_too = "application/json" in takes and sent.startswith("application/") and sent.endswith("+json")
        if takes and sent and sent not in takes and not json_too:
            return ApiError(415, f"{method} {path}: the body's Content-Type is {sent}, which this route does not read; "
                                 f"send it as {how}", None, "unsupported_media_type")
        return validation_error(error.errors())
    if isinstance(error, Busy):
        return ApiError(503, str(error), None, "server_busy", "server_error", {"Retry-After": str(error.retry_after)})
    if isinstance(error, EngineFailed):
        return ApiError(503, str(error), None, "engine_failed", "server_error")
    if isinstance(error, HTTPException):  # the framework's own: no route, a method the route lacks, a body unread
        if error.status_code == 404:
            return ApiError(404, f"{method} {path}: no such route; the API is POST /v1/audio/speech, GET, POST and "
                                 "DELETE /v1/audio/voices, GET /v1/models and /v1/models/ID", None, "not_found")
        if error.status_code == 405:
            allowed = (error.headers or {}).get("Allow", "")
            return ApiError(405, f"{method} {path}: the route does not take {method}; send {allowed}", None,
                            "method_not_allowed", headers=error.headers)
        if isinstance(error.__cause__, UnicodeDecodeError):
            return ApiError(400, "the request body is not UTF-8; send JSON encoded as UTF-8", None, "invalid_json")
        return ApiError(error.status_code, str(error.detail), None, None, headers=error.headers)
    return ApiError(500, f"the server failed this request ({type(error).__name__}: {error})", None, "server_error",
                    "server_error")


def validation_error(errors: list[dict]) -> ApiError:
    """pydantic's first complaint about a body, as a 400 that names its field."""
    if not errors:
        return ApiError(400, "the request body is not valid JSON for this route")
    first = errors[0]
    param = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or None
    if first.get("type") == "json_invalid":
        return ApiError(400, "the request body is not valid JSON; send a JSON object", None, "invalid_json")
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if str(first.get("type")).endswith("_type") and "input" in first:  # another JSON type: say which was sent
        sent = json.dumps(first["input"], default=str)
        message += f", not {sent if len(sent) <= 40 else sent[:37] + '...'}"
    code = "invalid_text" if isinstance((first.get("ctx") or {}).get("error"), NotText) else "invalid_value"
    return ApiError(400, f"{param}: {message}" if param else message, param, code)


class SpeechRequest(BaseModel):
    """POST /v1/audio/speech's body."""

    # strict: a number is a JSON number and a boolean a JSON boolean; pydantic's lax mode would take "4" for 4 and
    # true for 1.0, and a request would run with values its sender never meant
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, strict=True)

    model: str = ""
    input: str
    voice: str | dict | None = None
    response_format: str | None = None  # None: mp3 where it can be encoded, else wav (OpenAI's default is mp3)
    speed: float = Field(default=1.0, ge=MIN_SPEED, le=MAX_SPEED)  # the audio's tempo, at its pitch (tempo.py)
    stream_format: Literal["audio", "sse"] = "audio"
    stream: bool | None = None  # None: stream where the format allows it
    ref_audio: str | None = None
    ref_text: str | None = None
    x_vector_only_mode: bool = False
    task_type: str | None = None
    instructions: str = ""
    language: str = "Auto"
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    temperature: float | None = Field(default=None, gt=0)
    top_k: int | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seq_groups: int | None = Field(default=None, ge=1, le=MAX_SEQ_GROUPS)
    max_new_tokens: int | None = Field(default=None, ge=1)

    @field_validator("*")
    @classmethod
    def _encodable(cls, value):
        return check_text(value) if isinstance(value, str) else value

    @field_validator("input")
    @classmethod
    def _input(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the text is empty; send the words to speak")
        if len(value) > MAX_INPUT_CHARS:
            raise ValueError(f"the text is {len(value)} characters, over the {MAX_INPUT_CHARS} a request takes; "
                             "split it into several requests")
        return value

    @field_validator("task_type")
    @classmethod
    def _task(cls, value: str | None) -> str | None:
        if value is not None and value not in TASKS:
            raise ValueError(f"{value!r} is not a task; use one of {', '.join(TASKS)}")
        return value

    @property
    def voice_name(self) -> str | None:
        """OpenAI sends a voice as a name, or newer clients as {"id": name}."""
        if isinstance(self.voice, dict):
            voice = self.voice.get("id")
            if not isinstance(voice, str):
                raise ApiError(400, 'voice: an object voice needs an "id" string', "voice", "invalid_value")
            return voice
        return self.voice
