"""Profiling a window of training steps (``equishard train --profile DIR --profile-steps A:B``).

torch's profiler records steps ``A`` to ``B - 1`` of every rank (the first steps compile kernels
and grow the caching allocator, so the default window starts later). When the window closes each
rank writes, into ``DIR``:

* ``rank{r}-ops.txt``: the operators and kernels that took the most time (device time on a GPU,
  CPU time without one), from the profiler's ``key_averages`` table;
* ``rank{r}-summary.json``: the window's wall seconds, the seconds the device spent in kernels
  (their share of the wall: what the GPU waited for the host), the top operators, and the counts
  of the runtime calls that stall a step (device allocations and frees, synchronizations, copies
  to the host);
* on a GPU, ``sync_sites`` in the summary: the lines of Python that made the host wait for the
  device (``torch.cuda.set_sync_debug_mode("warn")`` during the window), with their counts;
* ``rank{r}-trace.json.gz`` with ``--profile-trace``: the timeline for chrome://tracing or
  Perfetto.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from trainer_adapter.train.config import parse_steps  # re-exported

__all__ = ["StepProfiler", "parse_steps"]

# runtime calls that make the host wait or allocate device memory, counted in the summary
STALLS = (
    "cudaMalloc",
    "cudaFree",
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpyAsync",
)


class StepProfiler:
    """Wraps a training loop: ``before(step)`` and ``after(step)`` around each step."""

    def __init__(self, out: str | Path, start: int, stop: int, *, rank: int, device, trace=False):
        self.out, self.start, self.stop = Path(out), start, stop
        self.rank, self.cuda, self.trace = rank, torch.device(device).type == "cuda", trace
        self.prof = None
        self._caught = None  # catch_warnings of the sync debug mode, while the window is open
        self.summary: dict | None = None  # the window's figures, once it closed
        self.wall = 0.0
        self.steps = 0

    def active(self, step: int) -> bool:
        return self.start <= step < self.stop

    def before(self, step: int) -> None:
        if step == self.start:
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self.prof = profile(activities=acts, record_shapes=False)
            self.prof.start()
            if self.cuda:
                self._caught = warnings.catch_warnings(record=True)
                self._records = self._caught.__enter__()
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")

    def after(self, step: int, seconds: float) -> None:
        if self.prof is None or not self.active(step):
            return
        self.wall += seconds
        self.steps += 1
        if step == self.stop - 1:
            self.close()

    def close(self) -> dict | None:
        """Stops the profiler and writes the files (also for a loop that ended early)."""
        if self.prof is None:
            return None
        prof, self.prof = self.prof, None
        prof.stop()
        sites = None
        if self._caught is not None:
            torch.cuda.set_sync_debug_mode(0)
            self._caught.__exit__(None, None, None)
            self._caught = None
            sites = sync_sites(self._records)
        self.out.mkdir(parents=True, exist_ok=True)
        summary = summarize(prof, self.wall, self.steps, cuda=self.cuda)
        summary["sync_sites"] = sites
        sort = "self_device_time_total" if self.cuda else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=70)
        (self.out / f"rank{self.rank}-ops.txt").write_text(table)
        (self.out / f"rank{self.rank}-summary.json").write_text(json.dumps(summary, indent=1))
        if self.trace:
            prof.export_chrome_trace(str(self.out / f"rank{self.rank}-trace.json.gz"))
        self.summary = summary
        return summary


def sync_sites(records: list[warnings.WarningMessage], top: int = 20) -> dict[str, int]:
    """``file:line`` -> how often it made a synchronizing CUDA call (the sync debug mode's
    warnings), most frequent first."""
    counts = Counter(
        f"{Path(w.filename).parent.name}/{Path(w.filename).name}:{w.lineno}"
        for w in records
        if "synchroniz" in str(w.message)
    )
    return dict(counts.most_common(top))


def summarize(prof, wall: float, steps: int, *, cuda: bool, top: int = 15) -> dict:
    """The window's figures from a stopped profiler (times in seconds). Device time is summed
    over the kernels themselves (a CPU operator's device time repeats its kernels')."""
    ka = prof.key_averages()
    kernels = [e for e in ka if e.device_type == DeviceType.CUDA]
    busy = sum(e.self_device_time_total for e in kernels) / 1e6 if cuda else None
    host = sorted((e for e in ka if e.device_type == DeviceType.CPU),
                  key=lambda e: e.self_cpu_time_total, reverse=True)  # fmt: skip
    stalls = {k: 0 for k in STALLS}
    for e in ka:
        for k in STALLS:
            if e.key == k or e.key.startswith(k + "_"):  # cudaMalloc, cudaMallocAsync_...
                stalls[k] += e.count
    kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return {
        "steps": steps,
        "wall_s": wall,
        "device_busy_s": busy,
        "device_busy_share": busy / wall if busy is not None and wall > 0 else None,
        "runtime_calls": stalls,
        "top_kernels": [
            {"name": e.key, "count": e.count, "device_s": e.self_device_time_total / 1e6}
            for e in kernels[:top]
        ],
        "top_host": [
            {"name": e.key, "count": e.count, "cpu_s": e.self_cpu_time_total / 1e6}
            for e in host[:top]
        ],
    }
