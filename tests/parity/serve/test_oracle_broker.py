"""A pinned vLLM server lent by a broker is as good as a new one for the next run: the prompt a
first run cached in its prefix cache is not a cache hit for the second run (the broker's
``/reset_prefix_cache`` between leases), while within one run the cache works as upstream's
does. And a config upstream refuses is refused once, then answered from the broker's memory.
What the server leaves in the temp folder (sockets, a rendezvous file) is in a folder of its own.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil
import pytest

from contract.scripted import vocab
from parity.serve.lease import BrokerClient
from parity.serve.observe import parse_metrics
from parity.serve.pool import ServerHandle, ServerPool
from parity.serve.spec import ServerConfig
from parity.server_temp import IPC_ENV

pytestmark = [pytest.mark.oracle, pytest.mark.server, pytest.mark.timeout(900)]

BLOCK = 32
# three full KV blocks of prompt (the prefix cache keeps full blocks only)
PROMPT = [vocab.BOS, *([65] * (3 * BLOCK + 4)), vocab.answer_selector(4)]
HITS = "vllm:prefix_cache_hits_total"


def hits(handle: ServerHandle) -> float:
    text = httpx.get(f"{handle.url}/metrics", timeout=30).text
    return sum(v for k, v in parse_metrics(text, 0.0).samples.items() if k.startswith(HITS))


def complete(handle: ServerHandle) -> None:
    body = {"model": handle.model_name, "prompt": PROMPT, "max_tokens": 4, "temperature": 0.0}
    response = httpx.post(f"{handle.url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text


def test_a_lent_oracle_has_no_prefix_cache_from_the_run_before(
    own_broker: BrokerClient, scripted_model_dir: Path, tmp_path: Path
) -> None:
    config = ServerConfig(
        model=str(scripted_model_dir),
        engine_args={"block_size": BLOCK, "num_gpu_blocks_override": 64, "max_model_len": 256},
        served_model_name="scripted",
    )
    with ServerPool(tmp_path / "first", broker=own_broker) as first:
        handle = first.get("oracle", config, startup_timeout_s=600)
        assert handle.leased and handle.startup.started, handle.startup.describe()
        complete(handle)
        before = hits(handle)
        complete(handle)
        assert hits(handle) - before >= 3 * BLOCK  # within a run: upstream's prefix cache
        # what the pin leaves in the temp folder (its ZeroMQ sockets, its worker's rendezvous
        # file) is in a folder of its own, which goes when the server is reaped
        # (parity.server_temp), not in the temp folder for good
        assert handle.process is not None
        env = psutil.Process(handle.process.pid).environ()
        folder = Path(env[IPC_ENV])
        assert folder.name.startswith("parity-tmp-") and env["TMPDIR"] == str(folder)
        assert [p for p in folder.iterdir() if p.is_socket()]
        assert [p for p in folder.iterdir() if p.name.startswith("vllm_dist_")]
    with ServerPool(tmp_path / "second", broker=own_broker) as second:
        again = second.get("oracle", config, startup_timeout_s=600)
        assert again.leased and again.startup.reused == 1, again.startup.describe()
        assert again.startup.port == handle.startup.port  # the same server, lent again
        before = hits(again)
        complete(again)
        assert hits(again) == before  # emptied between the runs: nothing to hit
    refused = ServerConfig(
        model=str(scripted_model_dir),
        engine_args={"block_size": BLOCK, "num_gpu_blocks_override": 1},
        served_model_name="scripted",
    )
    for run in ("a", "b"):
        with ServerPool(tmp_path / run, broker=own_broker) as pool:
            record = pool.get("oracle", refused, startup_timeout_s=600).startup
            assert record.outcome == "startup_refused", record.describe()
    assert own_broker.status()["started"] == 2  # one server, one refusal: nothing else
