"""Each server's own temp folder: what the server leaves there goes with its group, torch's
cache stays shared, a socket folder the caller names is used (``parity/server_temp.py``)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from parity_helpers import started_python

from parity.server_temp import IPC_ENV, private_temp, torch_cache_name

pytestmark = pytest.mark.timeout(60)

# what the pinned vLLM leaves after a clean exit: ZeroMQ sockets under VLLM_RPC_BASE_PATH and
# its worker's rendezvous file (a torch FileStore) under the temp folder
LEAVES_FILES = """
import os, signal, socket, tempfile, time, uuid
signal.signal(signal.SIGTERM, signal.{sigterm})
sock = socket.socket(socket.AF_UNIX)
sock.bind(os.path.join(os.environ["VLLM_RPC_BASE_PATH"], str(uuid.uuid4())))
open(os.path.join(tempfile.gettempdir(), "vllm_dist_" + uuid.uuid4().hex), "w").close()
print("ready", flush=True)
time.sleep(60)
"""
# torch's own answer to where its inductor cache is: a kernel written there must outlive the
# server, as it does for a user's server
COMPILES = """
from pathlib import Path
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
cache = Path(default_cache_dir())
cache.mkdir(exist_ok=True)
(cache / "kernel.so").write_text("compiled")
print("ready", cache, flush=True)
"""


@pytest.fixture
def short_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The harness's temp folder for one test: short enough for socket paths (pytest's
    tmp_path is not), and removed afterwards with all that torch or a server put in it.
    (``tmp_path`` first: pytest places its own folders under the temp folder it finds.)"""
    with tempfile.TemporaryDirectory(prefix="st-", ignore_cleanup_errors=True) as folder:
        monkeypatch.setattr(tempfile, "tempdir", folder)
        yield Path(folder)


@pytest.mark.parametrize("sigterm", ["SIG_DFL", "SIG_IGN"])
def test_what_a_server_leaves_in_its_temp_folder_goes_with_its_group(
    short_temp: Path, tmp_path: Path, sigterm: str
) -> None:
    process = started_python(LEAVES_FILES.format(sigterm=sigterm), tmp_path / "p.log")
    folder = process.temp_folder
    assert folder is not None and folder.parent == short_temp
    left = sorted(p.name for p in folder.iterdir())
    assert any(name.startswith("vllm_dist_") for name in left), left
    assert [p for p in folder.iterdir() if p.is_socket()], left
    record = process.stop(grace_s=0.5)
    assert record.sigterm_sufficed == (sigterm == "SIG_DFL"), record
    assert not folder.exists()
    assert [p.name for p in short_temp.iterdir()] == [torch_cache_name(os.environ)]


def test_torch_cache_outlives_the_server(short_temp: Path, tmp_path: Path) -> None:
    process = started_python(COMPILES, tmp_path / "p.log")
    folder = process.temp_folder
    assert folder is not None
    process.stop(grace_s=2.0)
    assert not folder.exists()
    kernel = short_temp / torch_cache_name(os.environ) / "kernel.so"
    assert kernel.read_text() == "compiled", process.log_tail()


def test_a_socket_folder_the_caller_names_is_used(short_temp: Path, tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="own-ipc-", ignore_cleanup_errors=True) as folder:
        own = Path(folder)
        env = {**os.environ, IPC_ENV: str(own)}
        process = started_python(
            LEAVES_FILES.format(sigterm="SIG_DFL"), tmp_path / "p.log", env=env
        )
        private = process.temp_folder
        assert private is not None
        assert [p for p in own.iterdir() if p.is_socket()], process.log_tail()
        assert [p.name for p in private.iterdir() if p.name.startswith("vllm_dist_")]
        process.stop(grace_s=0.5)
        assert own.exists() and not private.exists()


def test_no_folder_of_its_own_when_its_socket_paths_would_be_too_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert private_temp({}) is None
    assert list(deep.iterdir()) == []  # nothing left behind either
    # with a socket folder named by the caller, a deep temp folder is no obstacle
    folder = private_temp({IPC_ENV: "/run/sockets"})
    assert folder is not None and folder.parent == deep


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"LOGNAME": "ada", "USER": "bob"}, "torchinductor_ada"),
        ({"USER": "dom\\ain:x"}, "torchinductor_dom_ain_x"),
    ],
)
def test_torch_cache_name_follows_the_servers_user(env: dict[str, str], name: str) -> None:
    assert torch_cache_name(env) == name
