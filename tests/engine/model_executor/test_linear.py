"""``Linear``: every kernel computes x W^T + b; ``KernelChooser`` keeps each row range's
fastest kernel after timing every candidate on whole forward passes."""

from __future__ import annotations

import itertools

import pytest
import torch

from engine.model_executor.linear import (
    DEFAULT_KERNEL,
    KERNELS,
    ROW_RANGES,
    TRIALS,
    KernelChooser,
    Linear,
    range_index,
    share_chooser,
)

pytestmark = pytest.mark.timeout(120)


def layer_with(out_features: int, in_features: int, bias: bool, seed: int = 0) -> Linear:
    torch.manual_seed(seed)
    layer = Linear(in_features, out_features, bias=bias)
    layer.weight.data = torch.randn(out_features, in_features) * 0.05
    if bias:
        assert layer.bias is not None
        layer.bias.data = torch.randn(out_features)
    return layer


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 8, 16, 32, 48, 64])
def test_every_kernel_agrees_with_a_float64_reference(rows: int, bias: bool) -> None:
    """Each kernel, through ``forward``'s dispatch, with and without the packed copy."""
    layer = layer_with(192, 256, bias, seed=rows)
    x = torch.randn(rows, 256)
    want = x.double() @ layer.weight.double().t()
    if layer.bias is not None:
        want += layer.bias.double()
    for packed, kernel in itertools.product((False, True), KERNELS):
        if packed:
            layer.prepack()
        layer.chooser = KernelChooser((kernel,))
        got = layer(x)
        assert got.shape == (rows, 192) and got.dtype == torch.float32 and got.is_contiguous()
        assert torch.allclose(got.double(), want, atol=1e-4, rtol=1e-4), (rows, packed, kernel)


def test_rows_map_to_their_range() -> None:
    for index, (first, last) in enumerate(ROW_RANGES):
        assert range_index(first) == index
        assert range_index(last if last is not None else 10_000) == index
    layer = Linear(8, 8, bias=False)
    assert layer.chooser is None and layer.available() == ("mkl", "mkl_wt")
    layer.prepack()
    assert layer.available() == KERNELS  # the pinned torch (2.13.0+cpu) has oneDNN
    assert DEFAULT_KERNEL == "onednn"


class PassClock:
    """A clock for ``KernelChooser``: a timed pass with ``kernel`` at ``rows`` takes
    ``cost[(kernel, range)]`` (1.0 unless given); ``run`` times one pass like the model does."""

    def __init__(self, cost: dict[tuple[str, int], float]) -> None:
        self.now = 0.0
        self.cost = cost

    def __call__(self) -> float:
        return self.now

    def run(self, chooser: KernelChooser, rows: int) -> str:
        kernel = chooser.kernel(rows)
        with chooser.timed(rows):
            self.now += self.cost.get((kernel, range_index(rows)), 1.0)
        return kernel


def test_each_range_keeps_its_fastest_kernel_after_every_candidate_had_its_trials() -> None:
    winners = ("mkl", "mkl_wt", "onednn", "onednn", "mkl", "mkl_wt", "onednn", "mkl")
    clock = PassClock({(k, i): 0.5 for i, k in enumerate(winners)})
    chooser = KernelChooser(KERNELS, clock=clock)
    for index, (first, _) in enumerate(ROW_RANGES):
        used = [clock.run(chooser, first) for _ in range(TRIALS * len(KERNELS))]
        # candidates take turns, each TRIALS times
        assert used == list(KERNELS) * TRIALS
        assert chooser.chosen[index] == winners[index]
        assert chooser.kernel(first) == winners[index]
        # later passes run the winner, untimed
        before = clock.now
        assert clock.run(chooser, first) == winners[index]
        assert chooser.chosen[index] == winners[index] and clock.now > before
    labels = ["1", "2", "3", "4-7", "8-15", "16-31", "32-63", "64+"]
    assert chooser.settled() == dict(zip(labels, winners, strict=True))


def test_a_range_settles_on_its_own_passes_only() -> None:
    """Passes of one range do not count for another; a range is unsettled until its own
    candidates had every trial."""
    clock = PassClock({("mkl_wt", range_index(2)): 0.1, ("mkl", range_index(3)): 0.1})
    chooser = KernelChooser(KERNELS, clock=clock)
    for _ in range(TRIALS * len(KERNELS) - 1):
        clock.run(chooser, 2)
        clock.run(chooser, 3)
        clock.run(chooser, 8)  # the 8-15 range
    assert chooser.settled() == {}
    clock.run(chooser, 2)
    assert chooser.settled() == {"2": "mkl_wt"}


def test_the_best_pass_counts_not_the_first() -> None:
    """A slow first pass (a cold cache, a busy moment) does not lose a kernel the range."""
    clock = PassClock({})
    chooser = KernelChooser(("mkl", "onednn"), clock=clock)
    costs = {"mkl": [9.0, 0.2, 0.2], "onednn": [0.5, 0.5, 0.5]}
    while chooser.chosen[0] is None:
        kernel = chooser.kernel(1)
        with chooser.timed(1):
            clock.now += costs[kernel].pop(0)
    assert chooser.chosen[0] == "mkl"


def test_a_failed_pass_is_not_counted() -> None:
    clock = PassClock({})
    chooser = KernelChooser(KERNELS, clock=clock)
    with pytest.raises(RuntimeError), chooser.timed(1):
        raise RuntimeError("forward failed")
    assert chooser.kernel(1) == KERNELS[0]  # still the first candidate's turn


def test_shared_chooser_offers_only_kernels_every_projection_can_run() -> None:
    packed, plain = layer_with(32, 16, bias=False), layer_with(16, 16, bias=True)
    packed.prepack()
    chooser = share_chooser([packed, plain])
    assert chooser.candidates == ("mkl", "mkl_wt")
    assert packed.chooser is chooser and plain.chooser is chooser
    plain.prepack()
    assert share_chooser([packed, plain]).candidates == KERNELS
    assert KernelChooser(("onednn",)).settled() == dict.fromkeys(
        ["1", "2", "3", "4-7", "8-15", "16-31", "32-63", "64+"], "onednn"
    )
