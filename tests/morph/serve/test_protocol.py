"""What a speech request may say and the error every failure is answered with (morph/serve/protocol.py), without a
server: the input's bounds (exactly 4,096 characters taken, one more refused), text that is no Unicode, numbers that
are not finite, values of another JSON type than their field's, and the one mapping from what went wrong to OpenAI's
error shape. The same over real HTTP: test_app.py and test_faults.py."""

from __future__ import annotations

import json

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from morph.errors import Busy, EngineFailed
from morph.serve.protocol import MAX_INPUT_CHARS, ApiError, NotText, SpeechRequest, api_error, check_text, \
    validation_error


def refusal(**body) -> ApiError:
    with pytest.raises(ValidationError) as e:
        SpeechRequest(**{"input": "Hello.", **body})
    return validation_error(e.value.errors())


def test_the_input_bound_is_exactly_4096_characters():
    assert MAX_INPUT_CHARS == 4096
    assert SpeechRequest(input="x" * 4096).input == "x" * 4096
    error = refusal(input="x" * 4097)
    assert (error.status, error.param) == (400, "input")
    assert error.message == ("input: the text is 4097 characters, over the 4096 a request takes; split it into several "
                             "requests")
    assert refusal(input=" \n").message == "input: the text is empty; send the words to speak"


@pytest.mark.parametrize("field", ["input", "instructions", "ref_text", "language", "voice"])
def test_a_lone_surrogate_is_a_400_naming_its_field(field):
    text = json.loads('"Hello \\ud800 there."')  # what a JSON body with the escape parses to
    error = refusal(**{field: text})
    assert (error.status, error.param, error.code) == (400, field, "invalid_text")
    assert error.message == (f"{field}: character 6 ('\\ud800') is not valid Unicode text (a lone surrogate); send "
                             "the text as UTF-8")
    assert SpeechRequest(input="Grüße, 你好 🙂").input == "Grüße, 你好 🙂"  # any real text passes
    assert check_text("Grüße 🙂") == "Grüße 🙂"
    with pytest.raises(NotText, match="character 0"):
        check_text(text[6:])


NUMBERS = ["speed", "temperature", "top_p", "seed", "top_k", "seq_groups", "max_new_tokens"]
BOOLEANS = ["stream", "x_vector_only_mode"]


@pytest.mark.parametrize("field,value,kind", [(f, v, "number" if f in ("speed", "temperature", "top_p") else "integer")
                                              for f in NUMBERS for v in (True, False, "4", [4], {"n": 4})]
                         + [(f, v, "boolean") for f in BOOLEANS for v in (1, 0, "true", "false", None)])
def test_a_value_of_another_json_type_is_a_400_naming_its_field(field, value, kind):
    """No coercion: `true` is no number (pydantic's lax mode takes it as 1), "4" no integer, 1 or "true" no boolean."""
    if field == "stream" and value is None:  # stream may be null: where the format allows, it streams
        assert SpeechRequest(input="a", stream=None).stream is None
        return
    error = refusal(**{field: value})
    assert (error.status, error.param, error.code) == (400, field, "invalid_value")
    assert error.message.startswith(f"{field}: Input should be a valid {kind}, not {json.dumps(value)}"), error.message


def test_the_value_sent_is_shown_short():
    error = refusal(speed="x" * 100)
    assert error.message == f'speed: Input should be a valid number, not "{"x" * 36}...'


def test_numbers_keep_their_json_forms():
    """An integer is a number (2 for a float field), and a whole float is no integer."""
    assert SpeechRequest(input="a", speed=2, temperature=1, top_p=1).speed == 2.0
    assert refusal(max_new_tokens=4.0).message == "max_new_tokens: Input should be a valid integer, not 4.0"
    assert SpeechRequest(input="a", stream=False, x_vector_only_mode=True).x_vector_only_mode is True


@pytest.mark.parametrize("field,value", [("temperature", float("inf")), ("top_p", float("nan")),
                                         ("speed", float("-inf"))])
def test_numbers_must_be_finite(field, value):
    error = refusal(**{field: value})
    assert (error.status, error.param) == (400, field)
    assert "finite" in error.message


def test_sampling_fields_keep_their_bounds():
    assert refusal(temperature=0).param == "temperature"
    assert refusal(top_p=1.01).param == "top_p"
    assert SpeechRequest(input="a", top_p=1, top_k=0, seed=0, seq_groups=1, max_new_tokens=1).top_p == 1
    assert refusal(seed=-1).param == "seed"
    assert refusal(seed=2**63).param == "seed"
    assert SpeechRequest(input="a", seed=2**63 - 1).seed == 2**63 - 1
    assert refusal(seq_groups=0).param == "seq_groups"
    assert refusal(max_new_tokens=0).param == "max_new_tokens"
    assert refusal(speed=0.2).message == "speed: Input should be greater than or equal to 0.25"
    assert refusal(speed=4.01).message == "speed: Input should be less than or equal to 4"
    assert [SpeechRequest(input="a", speed=s).speed for s in (0.25, 1, 4)] == [0.25, 1.0, 4.0]
    assert SpeechRequest(input="a").speed == 1.0
    assert SpeechRequest(input="a", task_type=None).task_type is None  # a JSON null is no task
    assert refusal(task_type="Singing").message == "task_type: 'Singing' is not a task; use one of Base, CustomVoice, " \
                                                   "VoiceDesign"
    assert SpeechRequest(input="a", task_type="VoiceDesign", unknown_field=1).task_type == "VoiceDesign"


def test_an_object_voice_needs_an_id():
    assert SpeechRequest(input="a", voice={"id": "alice"}).voice_name == "alice"
    assert SpeechRequest(input="a", voice="bob").voice_name == "bob"
    with pytest.raises(ApiError) as e:
        SpeechRequest(input="a", voice={"name": "alice"}).voice_name
    assert (e.value.status, e.value.param) == (400, "voice")


def body(error: ApiError) -> dict:
    return json.loads(error.response().body)


def test_an_error_answers_with_its_status_headers_and_openais_shape():
    error = ApiError(503, "serve: busy", None, "server_busy", "server_error", {"Retry-After": "7"})
    response = error.response()
    assert str(error) == "serve: busy" and response.status_code == 503 and response.headers["retry-after"] == "7"
    assert body(error) == {"error": {"message": "serve: busy", "type": "server_error", "param": None,
                                     "code": "server_busy"}}
    assert ApiError(400, "x").kind == "invalid_request_error" and ApiError(400, "x").headers == {}


def test_every_failure_maps_to_one_openai_shaped_answer():
    own = ApiError(409, "name: taken", "name", "voice_exists")
    assert api_error(own) is own
    assert body(own) == {"error": {"message": "name: taken", "type": "invalid_request_error", "param": "name",
                                   "code": "voice_exists"}}

    busy = api_error(Busy("serve: 9 rows are waiting", 7))
    assert busy.message == "serve: 9 rows are waiting"
    assert (busy.status, busy.code, busy.kind, busy.headers) == (503, "server_busy", "server_error",
                                                                 {"Retry-After": "7"})
    failed = api_error(EngineFailed("the speech engine failed (RuntimeError: CUDA error: device-side assert)"))
    assert (failed.status, failed.code, failed.kind) == (503, "engine_failed", "server_error")
    assert "device-side assert" in failed.message

    missing = api_error(HTTPException(404), "GET", "/v1/nothing")
    assert (missing.status, missing.code) == (404, "not_found")
    assert missing.message == ("GET /v1/nothing: no such route; the API is POST /v1/audio/speech, GET, POST and DELETE "
                               "/v1/audio/voices, GET /v1/models and /v1/models/ID")
    wrong = api_error(HTTPException(405, headers={"Allow": "POST"}), "GET", "/v1/audio/speech")
    assert (wrong.status, wrong.code, wrong.headers) == (405, "method_not_allowed", {"Allow": "POST"})
    assert wrong.message == "GET /v1/audio/speech: the route does not take GET; send POST"
    unread = HTTPException(400, "There was an error parsing the body")
    unread.__cause__ = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    assert (api_error(unread).status, api_error(unread).code) == (400, "invalid_json")
    assert api_error(unread).message == "the request body is not UTF-8; send JSON encoded as UTF-8"
    other = api_error(HTTPException(400, "There was an error parsing the body", headers={"X-Why": "1"}))
    assert (other.status, other.message, other.headers) == (400, "There was an error parsing the body", {"X-Why": "1"})

    bug = api_error(KeyError("x"))
    assert (bug.status, bug.code, bug.kind) == (500, "server_error", "server_error")
    assert bug.message == "the server failed this request (KeyError: 'x')"

    refused = RequestValidationError([{"type": "model_attributes_type", "loc": ("body",), "msg": "dictionary"}])
    for path, sent, send in (("/v1/audio/speech", "text/plain; charset=utf-8", "Content-Type: application/json"),
                             ("/v1/audio/voices", "application/json", "multipart form (curl -F")):
        wrong = api_error(refused, "POST", path, sent)
        assert (wrong.status, wrong.code, wrong.param) == (415, "unsupported_media_type", None)
        assert wrong.message.startswith(f"POST {path}: the body's Content-Type is {sent.split(';')[0]}, which this "
                                        "route does not read; send it as ") and send in wrong.message
    for path, sent in (("/v1/audio/speech", "application/json"), ("/v1/audio/speech", "Application/JSON"),
                       ("/v1/audio/speech", "application/merge-patch+json"), ("/v1/audio/speech", None),
                       ("/v1/audio/voices", "multipart/form-data; boundary=x"),
                       ("/v1/audio/voices", "application/x-www-form-urlencoded"), ("/v1/models", "text/plain")):
        assert api_error(refused, "POST", path, sent).status == 400, (path, sent)  # the body's own fault
    invalid = api_error(RequestValidationError([{"type": "json_invalid", "loc": ("body", 3), "msg": "JSON"}]))
    assert (invalid.status, invalid.code, invalid.param) == (400, "invalid_json", None)
    assert invalid.message == "the request body is not valid JSON; send a JSON object"
    empty = validation_error([])
    assert (empty.status, empty.message) == (400, "the request body is not valid JSON for this route")
    assert validation_error([{"type": "x", "msg": "Value error, bad"}]).message == "bad"  # no field: no prefix
    nested = validation_error([{"type": "x", "loc": ("body", "voice", "id")}])
    assert (nested.param, nested.message) == ("voice.id", "voice.id: invalid value")
    missing_field = validation_error([{"type": "missing", "loc": ("body", "input"), "msg": "Field required"}])
    assert (missing_field.param, missing_field.message) == ("input", "input: Field required")
