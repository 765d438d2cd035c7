"""A temp folder of its own for each server the harness starts, removed once its group is reaped.

A server's temp files are the harness's to clean up, because the harness decides when the server
stops. The pinned vLLM leaves two kinds behind in the temp folder even after a clean SIGTERM
(docs/oracle-on-cpu.md): the ZeroMQ sockets it binds under ``VLLM_RPC_BASE_PATH`` (default: the
temp folder; seven per start) and the file its single worker rendezvouses through
(``vllm_dist_<uuid>``, a torch ``FileStore``; one per start). A day of runs left thousands. So
every server gets a new folder as ``TMPDIR`` and, unless the caller's environment names one, as
``VLLM_RPC_BASE_PATH``.

What a server should share with the next one stays shared: torch keeps its inductor cache (the
compiled kernels and a 154 MB precompiled header; vLLM's sampler compiles one on its first
request with logprobs) in ``torchinductor_<user>`` under the temp folder, so the new folder
holds a link of that name to the one in the harness's own temp folder, which the harness makes
if it is missing (torch's own folder, empty until a server compiles; it is never removed, since
a server of another run may be linked to it). Without the link every server would compile again
(8 s of g++, measured), and no user's server does.

A socket's path has at most 107 bytes. When sockets under the new folder would be longer than
that, the server gets no folder of its own, as a user with so deep a temp folder would have it.
"""

from __future__ import annotations

import os
import pwd
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

IPC_ENV = "VLLM_RPC_BASE_PATH"  # where vLLM binds its ipc:// sockets (default: the temp folder)
SUN_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path less its terminating NUL)
IPC_NAME_LEN = 36  # vLLM names each socket with a uuid4 (get_open_zmq_ipc_path)
PREFIX = "parity-tmp-"
# getpass.getuser's order, read from the server's environment rather than the harness's
USER_VARS = ("LOGNAME", "USER", "LNAME", "USERNAME")


def private_temp(env: Mapping[str, str]) -> Path | None:
    """A new folder under the temp folder for a server started with ``env``, with torch's
    cache linked in; None when its socket paths would be too long to bind (and the caller's
    environment names no socket folder of its own)."""
    folder = Path(tempfile.mkdtemp(prefix=PREFIX))
    if not env.get(IPC_ENV) and len(os.fsencode(folder)) + 1 + IPC_NAME_LEN > SUN_PATH_MAX:
        folder.rmdir()
        return None
    _link_torch_cache(folder, env)
    return folder


def server_env(env: Mapping[str, str], folder: Path | None) -> dict[str, str]:
    """``env`` for a server whose temp folder is ``folder`` (``env`` unchanged for None)."""
    out = dict(env)
    if folder is not None:
        out["TMPDIR"] = str(folder)
        if not out.get(IPC_ENV):
            out[IPC_ENV] = str(folder)
    return out


def torch_cache_name(env: Mapping[str, str]) -> str:
    """The folder torch's inductor keeps its cache in under the temp folder, for a process with
    ``env`` (torch/_inductor/runtime/cache_dir_utils.py ``default_cache_dir``)."""
    user = next((env[var] for var in USER_VARS if env.get(var)), None)
    if user is None:
        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = f"uid_{os.getuid()}"
    return "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)


def _link_torch_cache(folder: Path, env: Mapping[str, str]) -> None:
    name = torch_cache_name(env)
    shared = Path(tempfile.gettempdir()) / name
    try:
        # torch makes the folder when it first compiles; a link to nothing would make it fail
        shared.mkdir(exist_ok=True)
        (folder / name).symlink_to(shared, target_is_directory=True)
    except OSError:
        pass  # not ours to write (another user's folder): this server compiles for itself
