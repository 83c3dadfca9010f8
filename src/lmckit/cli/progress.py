"""Progress bars for the commands (one helper turns every Progress event stream into a
tqdm bar) and the time budget their estimates are checked against."""

from __future__ import annotations

import argparse
import sys
from typing import Any


class ProgressBars:
    """``bars(label)`` returns a callback that drives a tqdm bar for ``label`` (created on
    the first event, total taken from the events, metrics in the postfix), or ``None`` when
    quiet. The commands' steps run one after another, so a new bar closes the previous
    ones (their times stay true); the context manager closes the last."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bars: list[Any] = []
        self.kept: list[Any] = []

    def __enter__(self) -> ProgressBars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_finished()
        for bar in self.kept:
            bar.close()
        self.kept.clear()

    def close_finished(self) -> None:
        """Close the bars of steps that are over (all but the kept ones)."""
        for bar in self.bars:
            bar.close()
        self.bars.clear()

    def __call__(self, label: str, *, keep: bool = False, delay: float = 0.0):
        """A callback driving a bar for ``label``; ``keep``: an overall bar that later bars
        do not close; ``delay``: show the bar only once its work has lasted this long."""
        if not self.enabled:
            return None
        from tqdm.auto import tqdm

        state: dict[str, Any] = {}

        def callback(event) -> None:
            bar = state.get("bar")
            if bar is None:
                if not keep:
                    self.close_finished()
                bar = state["bar"] = tqdm(
                    total=event.total,
                    desc=label,
                    dynamic_ncols=True,
                    leave=keep or delay == 0,
                    delay=delay,
                    position=0 if keep else None,
                    mininterval=0.1 if sys.stderr.isatty() else 10.0,
                )
                (self.kept if keep else self.bars).append(bar)
            if event.total != bar.total:
                bar.total = event.total
            if event.step > bar.n:
                bar.update(event.step - bar.n)
            shown = {
                k: f"{v:.4g}" if isinstance(v, float) else v
                for k, v in event.metrics.items()
                if not isinstance(v, bool) and k not in ("seconds",)
            }
            if shown:
                bar.set_postfix(shown, refresh=False)

        return callback


class JobBars:
    """Per-job bars for ``lmckit run``, only for jobs that report progress."""

    def __init__(self, bars: ProgressBars) -> None:
        self.bars = bars

    def __call__(self, name: str):
        return self.bars(name, delay=1.0)  # short jobs come and go without a bar


def budget(args: argparse.Namespace):
    from lmckit.budget import Budget

    return Budget.hours(getattr(args, "max_hours", None))
