"""The PNG timeline of a chaos run: confirm latency and throughput over time, faults shaded."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .checker import Fault, Operation


def plot_timeline(history: list[Operation], faults: list[Fault], path: str | Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (latency_ax, rate_ax) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    for kind, colour in (("0-9-1", "tab:blue"), ("0-10", "tab:orange"), ("0-9-1-dedup", "tab:green")):
        points = [(op.time, op.latency * 1000) for op in history
                  if op.kind == "enqueue" and op.status == "ok" and op.client_kind == kind]
        if points:
            latency_ax.scatter(*zip(*points, strict=True), s=2, color=colour, label=f"{kind} confirm")
    latency_ax.set_yscale("log")
    latency_ax.set_ylabel("confirm latency (ms)")
    latency_ax.legend(loc="upper right", markerscale=4)
    confirmed = Counter(int(op.time) for op in history if op.kind == "enqueue" and op.status == "ok")
    received = Counter(int(op.time) for op in history if op.kind == "dequeue" and op.client != "drain")
    unknown = Counter(int(op.time) for op in history if op.kind == "enqueue" and op.status == "info")
    end = int(max((op.time for op in history if op.client != "drain"), default=0)) + 1
    seconds = list(range(end))
    rate_ax.plot(seconds, [confirmed[s] for s in seconds], label="confirmed/s")
    rate_ax.plot(seconds, [received[s] for s in seconds], label="consumed/s")
    rate_ax.bar(seconds, [unknown[s] for s in seconds], color="tab:red", label="unknown outcome")
    rate_ax.set_ylabel("operations per second")
    rate_ax.set_xlabel("seconds since start")
    rate_ax.legend(loc="upper right")
    for fault in faults:
        for ax in (latency_ax, rate_ax):
            ax.axvspan(fault.start, fault.end, color="tab:red", alpha=0.12)
        label = fault.name.split(":", 1)[0]  # damage nemeses list what they damaged after the colon
        latency_ax.text(fault.start, latency_ax.get_ylim()[1], label, rotation=90, va="top", fontsize=7)
    rate_ax.set_xlim(0, end)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
