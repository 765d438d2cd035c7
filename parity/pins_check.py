"""``parity pins check``: start a pin's oracle server on the scripted model and check it.

The server gets the flags the harness passes (``parity.serve.targets.server_flags``: block
size 32, 64 blocks, max_model_len 96, ``--enforce-eager --no-async-scheduling --dtype
float32``) and runs with the pin's own python (``parity.pins.pin_runtime``). One greedy
``/v1/completions`` with ``prompt: [389, 436]``, ``max_tokens: 8`` must return the scripted
model's tokens (``contract.scripted.script.expected``). One server at a time, bounded, reaped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx

from contract.scripted.script import expected
from parity.pins import PinError, pin_runtime
from parity.process import ManagedProcess, StartupError, free_port
from parity.serve.spec import ServerConfig
from parity.serve.targets import HOST, server_flags

PROMPT = (389, 436)
MAX_TOKENS = 8
ENGINE_ARGS = {"block_size": 32, "num_gpu_blocks_override": 64, "max_model_len": 96}
STARTUP_TIMEOUT_S = 600.0  # 290 s seen on this 2-core machine under a load of 9
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class ServeCheck:
    version: str
    startup_s: float
    tokens: tuple[int, ...]
    expected: tuple[int, ...]
    sigterm_sufficed: bool

    @property
    def ok(self) -> bool:
        return self.tokens == self.expected


def serve_argv(python: Path, config: ServerConfig, port: int) -> list[str]:
    """The argv that starts the oracle server with ``python`` (a pin's) on ``port``."""
    flags = ["--host", HOST, "--port", str(port), *server_flags(config)]
    return [str(python), "-m", "oracle", "serve", str(config.model_dir), *flags]


def check_serve(
    version: str,
    log_dir: Path,
    *,
    model: str = "scripted",
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
) -> ServeCheck:
    """Start pin ``version``'s server, send the greedy request, stop it; ``PinError`` on failure.

    ``model``: the scripted model's folder, or its name in ``.cache/models``."""
    config = ServerConfig(model=model, engine_args=ENGINE_ARGS, served_model_name="scripted")
    if not (config.model_dir / "model.safetensors").exists():
        raise PinError(f"no scripted model at {config.model_dir}: run make model")
    python, env = pin_runtime(version)
    port = free_port()
    log = log_dir / f"pin-{version}.log"
    proc = ManagedProcess(serve_argv(python, config, port), log_path=log, env=env)
    try:
        startup = proc.wait_healthy(f"http://{HOST}:{port}/health", startup_timeout_s)
        body = {
            "model": config.model_name,
            "prompt": list(PROMPT),
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "return_token_ids": True,
        }
        url = f"http://{HOST}:{port}/v1/completions"
        reply = httpx.post(url, json=body, timeout=REQUEST_TIMEOUT_S)
        if reply.status_code != 200:
            raise PinError(f"pin {version}: /v1/completions answered {reply.status_code}")
        tokens = tuple(reply.json()["choices"][0].get("token_ids") or ())
    except StartupError as exc:
        tail = " | ".join(exc.log_tail.strip().splitlines()[-2:])
        raise PinError(f"pin {version}: server {exc} (log {log}: {tail})") from None
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise PinError(f"pin {version}: bad completion reply: {exc!r} (log {log})") from None
    finally:
        record = proc.stop()
    want = tuple(expected(list(PROMPT), MAX_TOKENS))
    return ServeCheck(version, startup, tokens, want, record.sigterm_sufficed)


def format_check(check: ServeCheck) -> str:
    verdict = "ok" if check.ok else f"MISMATCH: expected {list(check.expected)}"
    stop = "" if check.sigterm_sufficed else ", needed SIGKILL"
    return (
        f"pin {check.version}: healthy in {check.startup_s:.1f} s; greedy {list(PROMPT)} x "
        f"{MAX_TOKENS} -> {list(check.tokens)}: {verdict}{stop}\n"
    )
