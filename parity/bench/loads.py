"""The loads of the serve-tier benchmark and their metrics (one load on one server).

A load is ``streams`` copies of one streaming completion sent at once: the scripted model's
``<|loop|>`` prompt (``" tick"``/``" tock"`` forever, never EOS) with ``ignore_eos`` and
temperature 0, so every stream yields exactly ``max_tokens`` tokens. Metrics follow ``vllm bench
serve`` (``vllm/benchmarks/serve.py:calculate_metrics`` at the pin): output tokens/s over the
load's wall time (first send to last byte), TTFT (send to the first frame carrying a token),
ITL (gaps between consecutive token-carrying frames: a frame that carries two tokens counts
once, as upstream's client does), TPOT ((E2E - TTFT) / (tokens - 1)), E2E (send to the last
byte), the peak RSS of the server's whole process tree (API server, EngineCore, workers)
sampled every 100 ms with psutil while the load runs, and the CPU time that tree spent during
the load (user + system; less sensitive to other processes on a shared machine than wall time,
though it counts the oracle's busy-waiting EngineCore and workers as the cost they are). Requests go through ``parity.serve``'s
observers (SSE frames timestamped on arrival).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import psutil

from contract.scripted import vocab
from parity.bench.stats import percentile, ratio, rounded
from parity.serve import (
    RequestObservation,
    ServeLimits,
    ServeRequestSpec,
    ServerHandle,
    ServeRun,
    run_serve,
)
from parity.serve.observe import frame_has_token

LOOP_PROMPT = (vocab.BOS, vocab.LOOP)
STARTUP_TIMEOUT_S = 300.0
RSS_INTERVAL_S = 0.1
MIB = 1024 * 1024
LIMITS = ServeLimits(startup_timeout_s=STARTUP_TIMEOUT_S, request_timeout_s=240.0, stall_s=30.0)
METRIC_KEYS = (
    "output_tok_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "tpot_mean_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
    "duration_s",
    "peak_rss_mib",
    "server_cpu_s",
    "cpu_ms_per_token",
)


@dataclass(frozen=True, slots=True)
class Load:
    """``streams`` concurrent streams of ``max_tokens`` tokens each."""

    name: str
    role: str  # single | mid | high: what the targets table refers to
    streams: int
    max_tokens: int


FULL_LOADS = (
    Load("1x256", "single", 1, 256),
    Load("8x128", "mid", 8, 128),
    Load("32x128", "high", 32, 128),
)
QUICK_LOADS = (
    Load("1x64", "single", 1, 64),
    Load("4x32", "mid", 4, 32),
    Load("8x32", "high", 8, 32),
)
WARMUP = Load("warmup", "warmup", 1, 8)


def load_request(load: Load) -> ServeRequestSpec:
    return ServeRequestSpec(
        id=load.name,
        prompt_token_ids=LOOP_PROMPT,
        max_tokens=load.max_tokens,
        stream=True,
        body={
            "ignore_eos": True,
            "temperature": 0.0,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        },
        repeat=load.streams,
        concurrency=load.streams,
    )


# --- process tree memory ------------------------------------------------------------------


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (0 if it is gone)."""
    total = 0
    for proc in _tree(pid):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants so far."""
    total = 0.0
    for proc in _tree(pid):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class RssSampler:
    """Samples ``tree_rss(pid)`` every ``interval_s`` in a thread; ``peak`` is the maximum."""

    def __init__(self, pid: int, interval_s: float = RSS_INTERVAL_S) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._sample()

    def _sample(self) -> None:
        self.peak = max(self.peak, tree_rss(self.pid))
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)


# --- one load -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadMetrics:
    """One load on one server (one repetition)."""

    load: str
    streams: int
    max_tokens: int
    completed: int  # streams that ended with [DONE] and exactly max_tokens tokens
    output_tokens: int
    duration_s: float | None
    output_tok_s: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    tpot_mean_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    peak_rss_mib: float | None
    server_cpu_s: float | None  # CPU the server's process tree spent during the load
    cpu_ms_per_token: float | None
    problems: tuple[str, ...] = ()  # one line per failed stream (at most 5)


def _token_frame_times(obs: RequestObservation) -> list[float]:
    return [frame.t_ms for frame in obs.frames if frame_has_token(frame.payload())]


def load_metrics(
    load: Load, run: ServeRun, peak_rss: int | None, server_cpu_s: float | None = None
) -> LoadMetrics:
    """The metrics of one load from its observations."""
    ttft: list[float] = []
    itl: list[float] = []
    e2e: list[float] = []
    tpot: list[float] = []
    problems: list[str] = []
    tokens = 0
    first_send: float | None = None
    last_end: float | None = None
    for obs in run.observations:
        count = obs.num_tokens
        tokens += count
        ok = obs.outcome == "completed" and obs.done and count == load.max_tokens
        if not ok:
            problems.append(f"{obs.request_id}: {obs.outcome} ({obs.detail}), {count} tokens")
            continue
        end = obs.t_last_byte_ms or obs.t_end_ms or 0.0
        first_send = obs.t_send_ms if first_send is None else min(first_send, obs.t_send_ms)
        last_end = obs.t_send_ms + end if last_end is None else max(last_end, obs.t_send_ms + end)
        times = _token_frame_times(obs)
        if obs.t_first_token_ms is not None:
            ttft.append(obs.t_first_token_ms)
            if count > 1:
                tpot.append((end - obs.t_first_token_ms) / (count - 1))
        itl.extend(b - a for a, b in zip(times, times[1:], strict=False))
        e2e.append(end)
    duration = None if first_send is None or last_end is None else (last_end - first_send) / 1000
    good_tokens = load.max_tokens * (len(run.observations) - len(problems))
    return LoadMetrics(
        load=load.name,
        streams=load.streams,
        max_tokens=load.max_tokens,
        completed=len(run.observations) - len(problems),
        output_tokens=tokens,
        duration_s=rounded(duration, 4),
        output_tok_s=rounded(ratio(float(good_tokens), duration), 2) if good_tokens else None,
        ttft_p50_ms=rounded(percentile(ttft, 50)),
        ttft_p99_ms=rounded(percentile(ttft, 99)),
        itl_p50_ms=rounded(percentile(itl, 50)),
        itl_p99_ms=rounded(percentile(itl, 99)),
        tpot_mean_ms=rounded(sum(tpot) / len(tpot) if tpot else None),
        e2e_p50_ms=rounded(percentile(e2e, 50)),
        e2e_p99_ms=rounded(percentile(e2e, 99)),
        peak_rss_mib=rounded(peak_rss / MIB, 1) if peak_rss else None,
        server_cpu_s=rounded(server_cpu_s, 3),
        cpu_ms_per_token=rounded(ratio(1000.0 * (server_cpu_s or 0.0), float(good_tokens)))
        if server_cpu_s is not None and good_tokens
        else None,
        problems=tuple(problems[:5]),
    )


def run_load(handle: ServerHandle, load: Load) -> LoadMetrics:
    """Run one load on a started server, sampling its process tree's RSS meanwhile and
    taking its CPU time before and after."""
    assert handle.process is not None
    pid = handle.process.pid
    cpu_before = tree_cpu_s(pid)
    with RssSampler(pid) as sampler:
        run = run_serve(handle, [load_request(load)], LIMITS, poll_s=1.0)
    return load_metrics(load, run, sampler.peak, tree_cpu_s(pid) - cpu_before)
