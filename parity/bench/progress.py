"""Progress display of a benchmark run (rich bars on stderr), or plain lines without a TTY.

``BenchProgress`` has an overall bar (one unit per server repetition, scheduler workload and
harness measurement), a line naming the current activity with its elapsed time, and keeps a
trail of milestones printed above the bars. Upstream: none.
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)


class BenchProgress:
    """``notify(message)`` names the current activity; ``advance()`` completes one unit."""

    def __init__(self, total: int, *, enabled: bool = True) -> None:
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.began = time.monotonic()
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            disable=not enabled,
            transient=False,
        )
        self._overall: TaskID = self._progress.add_task("benchmark", total=total)
        self._current: TaskID = self._progress.add_task("starting", total=None)

    def __enter__(self) -> BenchProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.update(self._current, description="done", visible=False)
        self._progress.stop()

    def phase(self, name: str) -> None:
        self._progress.update(self._overall, description=name)

    def notify(self, message: str) -> None:
        stamp = f"{time.monotonic() - self.began:7.1f}s"
        if self.enabled:
            self._progress.update(self._current, description=message)
            self._progress.console.print(f"[dim]{stamp}[/dim] {message}", highlight=False)
        else:
            self.console.print(f"{stamp} {message}", highlight=False, markup=False)

    def advance(self) -> None:
        self._progress.advance(self._overall)
