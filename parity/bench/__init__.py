"""``make bench``: engine vs oracle benchmarks in one run, written to ``reports/bench/<run-id>/``.

- ``serve``: HTTP servers, interleaved A/B with a fresh process per repetition: startup to
  /health, 1 x 256 / 8 x 128 / 32 x 128 streams (tokens/s, TTFT, ITL, E2E, peak RSS).
- ``scheduler``: step time of our scheduler vs upstream's; differential examples/s.
- ``harness``: wedge verdict latency; default-suite wall time.
- ``targets``: the speed targets (pass / fail per line); ``report``: JSON, Markdown, SVG charts.

Entry point: ``python -m parity.bench [--quick]`` (``parity.bench.cli.main``).
"""

from parity.bench.cli import main

__all__ = ["main"]
