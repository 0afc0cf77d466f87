"""What a long job leaves for people: metrics.jsonl, PNG curves, optional TensorBoard; what is counted between
two log records."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any


def read_series(run_dir: Path, key: str = "loss") -> list[tuple[int, float]]:
    """(step, value) of every record of `run_dir/metrics.jsonl` that has `key`, for curves across runs."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    records = (json.loads(line) for line in lines if line.strip())
    return [(r["step"], r[key]) for r in records if key in r]


class MetricsLog:
    """Appends one JSON object per log step and redraws PNG plots of chosen series.

    Reopening an existing file (on --resume) keeps its history and drops records past `resume_step`,
    so the curves of a resumed run have no duplicate or orphaned points.
    """

    def __init__(
        self,
        out_dir: Path,
        *,
        enabled: bool = True,
        resume_step: int | None = None,
        plots: dict[str, list[str]] | None = None,
        tensorboard: bool = True,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.enabled = enabled
        self.path = self.out_dir / "metrics.jsonl"
        self.plots = plots or {"loss.png": ["loss"]}
        self.records: list[dict[str, Any]] = []
        self.tb = None
        if not enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and resume_step is not None:
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
                if rec.get("step", 0) <= resume_step:
                    self.records.append(rec)
        self._rewrite()
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # optional

                self.tb = SummaryWriter(str(self.out_dir / "tensorboard"))
            except Exception:  # noqa: BLE001 - TensorBoard is optional
                self.tb = None

    def _rewrite(self) -> None:
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        os.replace(tmp, self.path)

    def log(self, step: int, **values: Any) -> None:
        if not self.enabled:
            return
        rec = {"step": step, "time": round(time.time(), 3), **values}
        self.records.append(rec)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        if self.tb is not None:
            for k, v in values.items():
                if isinstance(v, int | float):
                    self.tb.add_scalar(k, v, step)

    def plot(self) -> list[Path]:
        """Redraw every PNG (atomically, so a viewer never sees half a file)."""
        if not self.enabled or not self.records:
            return []
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        written = []
        for filename, keys in self.plots.items():
            fig, ax = plt.subplots(figsize=(7, 4))
            drawn = False
            for key in keys:
                pts = [(r["step"], r[key]) for r in self.records if isinstance(r.get(key), int | float)]
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="." if len(pts) < 50 else None, label=key)
                    drawn = True
            if drawn:
                ax.set_xlabel("step")
                ax.grid(alpha=0.3)
                ax.legend()
                ax.set_title(", ".join(keys))
                fig.tight_layout()
                target = self.out_dir / filename
                tmp = target.with_name(f".{target.stem}.tmp.png")
                fig.savefig(tmp, dpi=100)
                os.replace(tmp, target)
                written.append(target)
            plt.close(fig)
        return written

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


class LogInterval:
    """What happened since the last log record: the time, the steps, the items trained on (features,
    tokens) and the step losses that were finite (a skipped non-finite step shows in skipped_steps, not
    in the mean)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.t0 = time.time()
        self.steps, self.items, self.finite, self.loss_sum = 0, 0, 0, 0.0

    def add_step(self, loss: float) -> None:
        self.steps += 1
        if math.isfinite(loss):
            self.finite += 1
            self.loss_sum += loss

    def add_items(self, n: int) -> None:
        self.items += n

    def elapsed(self) -> float:
        return time.time() - self.t0

    def mean_loss(self) -> float:
        """The mean finite step loss over the interval (NaN if none): a readable curve."""
        return self.loss_sum / self.finite if self.finite else float("nan")
