"""Security defaults of ``python -m engine serve``: bind address, API key, body cap, model names.

- Bind: without ``--host`` the server listens on 127.0.0.1 only (checked with psutil on the
  server's listening sockets); ``--host`` is honoured (127.0.0.2). Upstream's ``--host``
  default is every interface; ours is the ledger's ``serve-defaults`` divergence.
- ``--api-key``: every ``/v1`` route the app serves (from its own ``/openapi.json``), every
  method, and unknown ``/v1`` paths answer 401 with the pin's body ``{"error":
  "Unauthorized"}`` (``vllm/entrypoints/serve/middleware/authenticate.py`` at the pin: not the
  usual error shape) without the key, with a wrong key, or with another scheme; with
  ``Authorization: Bearer <key>`` they are served. ``/health``, ``/metrics``, ``/version``,
  ``/ping``, ``/load`` and CORS preflights stay open, as upstream: the CORS middleware
  answers a preflight (200 for an origin in ``--allowed-origins``, 400 "Disallowed CORS
  origin" for any other; the default allows none, held to the oracle in
  ``test_bad_input_diff.py``).
- Body size: the default cap (16 MiB) answers 413 in vLLM's error shape, whether the size is
  declared (``Content-Length``) or streamed (chunked), and the server stays healthy. Upstream
  has no cap (ledger ``request-body-cap``).
- Model names are names, never paths: ``../../etc/passwd``, absolute paths, the path of a
  real model folder (a copy), ``file://`` URLs and the like all get 404 ``NotFoundError`` with
  ``param: "model"`` (``serve/engine/serving.py:49-84`` at the pin), and inotify sees no open or
  read of the decoy folder or of a sentinel file while they are served. (inotify does not see
  ``stat``; an existence probe alone would go unnoticed.)
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from reliability_support import RawServer, assert_error_shape, raw_engine_server

from parity.serve.spec import ROOT

pytestmark = [pytest.mark.server]

KEY = "s3cret-key"
ALLOWED = "http://allowed.example"
AUTH = {"Authorization": f"Bearer {KEY}"}
UNAUTHORIZED = {"error": "Unauthorized"}
DEFAULT_CAP = 16 * 1024 * 1024
OPEN_ROUTES = ("/health", "/metrics", "/version", "/ping", "/load", "/openapi.json")
COMMON_FLAGS = ("--block-size", "32", "--max-model-len", "256", "--served-model-name", "scripted",
                "--dtype", "float32", "--disable-uvicorn-access-log")  # fmt: skip


@pytest.fixture(scope="module")
def keyed_server(
    scripted_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RawServer]:
    """The server with ``--api-key`` and no ``--host`` flag (the default bind address)."""
    log_dir = tmp_path_factory.mktemp("keyed")
    flags = (*COMMON_FLAGS, "--api-key", KEY, "--allowed-origins", json.dumps([ALLOWED]))
    with raw_engine_server(scripted_model_dir, log_dir, *flags) as s:
        yield s


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on."""
    conns = psutil.Process(pid).net_connections(kind="inet")
    return {(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN}


# --- bind address ---------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_default_bind_is_loopback_only(keyed_server: RawServer) -> None:
    assert "--host" not in keyed_server.process.argv
    sockets = listening(keyed_server.process.pid)
    assert sockets == {("127.0.0.1", keyed_server.port)}, sockets
    for address in other_local_addresses():
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{address}:{keyed_server.port}/health", timeout=2.0)


def other_local_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (may be none)."""
    found = []
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family.name == "AF_INET" and not address.address.startswith("127."):
                found.append(address.address)
    return found


@pytest.mark.timeout(180)
def test_host_flag_is_honoured(scripted_model_dir: Path, tmp_path: Path) -> None:
    with raw_engine_server(scripted_model_dir, tmp_path, *COMMON_FLAGS, "--host", "127.0.0.2") as s:
        assert listening(s.process.pid) == {("127.0.0.2", s.port)}
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{s.port}/health", timeout=2.0)


# --- API key --------------------------------------------------------------------------------


def v1_operations(url: str) -> list[tuple[str, str]]:
    """(method, path) of every /v1 operation in the app's OpenAPI document."""
    spec = httpx.get(f"{url}/openapi.json", timeout=10).json()
    ops = [
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if path.startswith("/v1") and method in ("get", "post", "put", "delete", "patch")
    ]
    assert ("POST", "/v1/completions") in ops and ("GET", "/v1/models") in ops, ops
    return ops


@pytest.mark.timeout(120)
def test_api_key_guards_every_v1_route(keyed_server: RawServer) -> None:
    url = keyed_server.url
    ops = v1_operations(url)
    ops += [("GET", "/v1/nonexistent"), ("POST", "/v1/models"), ("DELETE", "/v1/completions")]
    bad_credentials: list[dict[str, str]] = [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {KEY}"},
        {"Authorization": KEY},
        {"Authorization": f"Bearer  {KEY}"},
        {"Authorization": f"Bearer {KEY[:-1]}"},
        {"Authorization": "Bearer"},
        {"X-API-Key": KEY},
    ]
    body = json.dumps({"model": "scripted", "prompt": [5, 6], "max_tokens": 1})
    with httpx.Client(base_url=url, timeout=30) as client:
        for method, path in ops:
            for headers in bad_credentials:
                response = client.request(
                    method,
                    path,
                    content=body,
                    headers={"content-type": "application/json", **headers},
                )
                assert (response.status_code, response.json()) == (401, UNAUTHORIZED), (
                    method, path, headers, response.text[:300],
                )  # fmt: skip
        for method, path in ops[:-3]:
            for good in (AUTH, {"Authorization": f"bearer {KEY}"}):  # the scheme is any case
                response = client.request(
                    method, path, content=body, headers={"content-type": "application/json", **good}
                )
                assert response.status_code != 401, (method, path)
        assert client.post("/v1/completions", content=body, headers={
            "content-type": "application/json", **AUTH}).status_code == 200  # fmt: skip
        for path in OPEN_ROUTES:
            assert client.get(path).status_code == 200, path
        for origin, status in ((ALLOWED, 200), ("http://example.com", 400)):
            preflight = client.options(
                "/v1/completions",
                headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
            )
            assert preflight.status_code == status, (origin, preflight.text)
            assert (preflight.headers.get("access-control-allow-origin") == origin) == (
                status == 200
            )
        assert preflight.text == "Disallowed CORS origin"
    print(f"\napi key: {len(ops)} /v1 operations x {len(bad_credentials)} bad credentials -> 401")


@pytest.mark.timeout(60)
def test_path_tricks_do_not_bypass_the_key(keyed_server: RawServer) -> None:
    raw_paths = [b"//v1/models", b"/./v1/models", b"/v1/../v1/models", b"/%76%31/models",
                 b"/V1/models", b"/v1/models/", b"/v1%2Fmodels", b"/v1/models?x=1"]  # fmt: skip
    with httpx.Client(timeout=10) as client:
        for raw in raw_paths:
            request = client.build_request("GET", keyed_server.url)
            request.url = request.url.copy_with(raw_path=raw)
            response = client.send(request)
            assert response.status_code != 200, (raw, response.text[:200])
            assert "scripted" not in response.text, (raw, response.text[:200])


# --- body size ------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_request_body_is_capped_at_16_mib(keyed_server: RawServer) -> None:
    url = f"{keyed_server.url}/v1/completions"
    big = b'{"prompt": "' + b"x" * DEFAULT_CAP + b'", "max_tokens": 1}'
    headers = {"content-type": "application/json", **AUTH}
    with httpx.Client(timeout=60) as client:
        declared = client.post(url, content=big, headers=headers)
        assert declared.status_code == 413, declared.text[:300]
        assert_error_shape(declared.json(), 413, "declared size")

        def chunks() -> Iterator[bytes]:  # no Content-Length: the server must count
            for start in range(0, len(big), 1 << 20):
                yield big[start : start + (1 << 20)]

        streamed = client.post(url, content=chunks(), headers=headers)
        assert streamed.status_code == 413, streamed.text[:300]
        error = assert_error_shape(streamed.json(), 413, "streamed size")
        assert error == declared.json()["error"], (error, declared.json())
        just_under = b'{"prompt": [5, 6], "max_tokens": 1, "pad": "' + b"y" * (1 << 20) + b'"}'
        assert client.post(url, content=just_under, headers=headers).status_code == 200
        assert client.get(f"{keyed_server.url}/health").status_code == 200


# --- model names are not paths --------------------------------------------------------------

IN_OPEN, IN_ACCESS, IN_NONBLOCK = 0x20, 0x01, os.O_NONBLOCK


class Inotify:
    """Open/read events on watched folders (Linux inotify through libc)."""

    def __init__(self, *paths: Path) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(IN_NONBLOCK)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        for path in paths:
            wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), IN_OPEN | IN_ACCESS)
            assert wd >= 0, (path, os.strerror(ctypes.get_errno()))

    def events(self) -> list[tuple[int, str]]:
        found: list[tuple[int, str]] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            offset = 0
            while offset < len(data):
                _, mask, _, length = struct.unpack_from("iIII", data, offset)
                name = data[offset + 16 : offset + 16 + length].rstrip(b"\0").decode()
                found.append((mask, name))
                offset += 16 + length

    def close(self) -> None:
        os.close(self.fd)


def model_names(decoy: Path, sentinel: Path) -> list[Any]:
    rel = os.path.relpath(sentinel, ROOT)
    return [
        "../../etc/passwd", "/etc/passwd", "..", ".", "./scripted", "scripted/../scripted",
        str(decoy), f"{decoy}/", f"{decoy}/config.json", f"file://{decoy}", str(sentinel), rel,
        "../" * 12 + str(sentinel).lstrip("/"), "~/.ssh/id_rsa", "..\\..\\windows\\win.ini",
        "scripted\x00", "scripted ", "SCRIPTED", f"{decoy}\x00scripted",
    ]  # fmt: skip


@pytest.mark.timeout(120)
def test_model_names_never_become_paths(
    keyed_server: RawServer, scripted_model_dir: Path, tmp_path: Path
) -> None:
    decoy = tmp_path / "decoy-model"
    shutil.copytree(scripted_model_dir, decoy)  # a real, loadable model folder
    sentinel = tmp_path / "sentinel" / "secret.txt"
    sentinel.parent.mkdir()
    sentinel.write_text("never read me")
    watch = Inotify(decoy, sentinel.parent)
    try:
        watch.events()  # drop anything from the copy
        names = model_names(decoy, sentinel)
        with httpx.Client(base_url=keyed_server.url, headers=AUTH, timeout=30) as client:
            for name in names:
                for path, body in (
                    ("/v1/completions", {"model": name, "prompt": [5, 6], "max_tokens": 1}),
                    ("/v1/chat/completions", {
                        "model": name, "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 1}),
                ):  # fmt: skip
                    response = client.post(path, json=body)
                    error = assert_error_shape(response.json(), 404, f"{path} model={name!r}")
                    assert (error["type"], error["param"]) == ("NotFoundError", "model")
                    assert error["message"].startswith("The model `"), error
                    assert error["message"].endswith("` does not exist. Valid aliases: scripted.")
            assert client.post("/v1/completions", json={
                "model": "scripted", "prompt": [5, 6], "max_tokens": 1}).status_code == 200  # fmt: skip
        events = watch.events()
    finally:
        watch.close()
    assert not events, f"the server touched the decoy/sentinel files: {events[:10]}"
    print(f"\nmodel names: {len(names)} path-like names x 2 endpoints -> 404, no file opened")
