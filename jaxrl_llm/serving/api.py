"""The HTTP routes (FastAPI): OpenAI's `/v1/chat/completions`, `/v1/completions` and
`/v1/models`, and the same under `/episodes/ID/v1` for a trainer's agent programs (each
episode's calls logged: `backend`).

Errors come back in OpenAI's shape, `{"error": {"message", "type", "code"}}`: 400 for
malformed JSON, unknown or invalid fields, a prompt that does not fit; 401 without the API
key (when the server has one); 404 for an unknown model or episode; 429 when the engine's
queue is full. A refused request changes nothing: the server goes on answering.
"""
from __future__ import annotations

import hmac
import json

import fastapi
from fastapi import exceptions, responses
from starlette import exceptions as starlette_exceptions

from jaxrl_llm.serving import protocol
from jaxrl_llm.serving.backend import Backend, RequestError


def _error(status: int, message: str, kind: str) -> responses.JSONResponse:
  return responses.JSONResponse(status_code=status, content={
      "error": {"message": message, "type": kind, "code": kind, "param": None}})


def _validation_message(error: exceptions.RequestValidationError) -> str:
  parts = []
  for e in error.errors()[:5]:
    where = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
    parts.append(f"{where or 'body'}: {e.get('msg')}" + (
        f" (got {str(e.get('input'))[:60]!r})" if e.get("type") != "json_invalid" else ""))
  return "; ".join(parts)


def _answer(request, response: dict):
  """The response, or with `stream: true` its chunks as server-sent events."""
  if not request.stream:
    return response
  chunks = protocol.stream_chunks(response, request.usage_in_stream())

  async def events():
    for chunk in chunks:
      yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"
  return responses.StreamingResponse(events(), media_type="text/event-stream")


def make_app(backend: Backend, api_key: str | None = None) -> fastapi.FastAPI:
  """The endpoint's ASGI app over `backend`; with `api_key`, every request must carry
  `Authorization: Bearer API_KEY`."""
  app = fastapi.FastAPI(title="jaxrl_llm", docs_url=None, redoc_url=None)

  @app.exception_handler(exceptions.RequestValidationError)
  async def invalid(_, error):  # malformed JSON, unknown fields, out-of-range values
    return _error(400, _validation_message(error), "invalid_request_error")

  @app.exception_handler(starlette_exceptions.HTTPException)
  async def http_error(_, error):  # unknown routes and methods, a body that does not parse
    kind = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code,
                                                            "invalid_request_error")
    return _error(error.status_code, str(error.detail), kind)

  @app.exception_handler(RequestError)
  async def refused(_, error: RequestError):
    return _error(error.status, str(error), error.kind)

  @app.middleware("http")
  async def authorize(request: fastapi.Request, call_next):
    if api_key is not None:
      given = request.headers.get("authorization", "")
      if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
        return _error(401, "missing or wrong API key (Authorization: Bearer KEY)",
                      "invalid_api_key")
    return await call_next(request)

  async def models_list():
    return {"object": "list", "data": [{"id": backend.model_name, "object": "model",
                                        "created": 0, "owned_by": "jaxrl_llm",
                                        "max_model_len": backend.engine.layout.context}]}

  async def chat(body: protocol.ChatRequest):
    return _answer(body, await backend.chat(body))

  async def complete(body: protocol.CompletionRequest):
    return _answer(body, await backend.complete(body))

  async def episode_chat(episode: str, body: protocol.ChatRequest):
    return _answer(body, await backend.chat(body, episode))

  app.get("/v1/models")(models_list)
  app.post("/v1/chat/completions")(chat)
  app.post("/v1/completions")(complete)
  app.get("/episodes/{episode}/v1/models")(models_list)
  app.post("/episodes/{episode}/v1/chat/completions")(episode_chat)
  return app
