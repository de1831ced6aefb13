"""The reserved GPUs as ``pool status --gpu-metrics`` shows them (issue 48): per reserved GPU, who the cluster gave
it to (as the exporter names them), how busy it was over the policy's window (mean and peak gfx activity) and its
VRAM in use, against the load inference is expected to keep at most (``spec.gpuMetrics.inferenceLoadPercent``, the
runbook's 40 %). Text and JSON; pure: the figures are ``judge``'s (``Judgement.loads``), nothing read twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.ops.capacity import Holder
from webhook.ops.gpus.judge import Judgement, Load, Thresholds
from webhook.ops.reservation import columns


@dataclass(frozen=True)
class GpuStatus:
    """What ``--gpu-metrics`` gave: the judgement, or why the series could not be read (``error``)."""

    limits: Thresholds
    judged: Judgement | None = None
    error: str | None = None


def _holder(holder: Holder) -> str:
    return f"{holder.class_name or '(out of scope)'}: {holder.namespace}/{holder.name}"


def held_by(load: Load) -> str:
    """``inference: serving/llm-0``; ``free``: no pod the cluster gave it, as the exporter names them."""
    return ", ".join(_holder(h) for h in load.holders) or "free"


def over(load: Load, limits: Thresholds) -> bool:
    """Held by inference and busier on average than inference is expected to keep it."""
    return any(h.inference for h in load.holders) and load.activity_percent > limits.inference_load_percent


def _num(value: float) -> str:
    return f"{value:.0f}"


def status_lines(status: GpuStatus) -> list[str]:
    """The section's lines; none when the series could not be read (the command says why, in one warning)."""
    judged, limits = status.judged, status.limits
    if judged is None:
        return []
    window = f"{limits.window_seconds:g} s"
    if not judged.loads:
        return [f"Reserved GPUs as the exporter reports them: none judged (the last {window}; see the warnings)."]
    lines = [
        f"Reserved GPUs as the exporter reports them (gfx activity over the last {window}; inference is expected to "
        f"keep one at most {_num(limits.inference_load_percent)} % busy on average):"
    ]
    rows = [["NODE", "GPU", "PCI BUS ID", "HELD BY", "MEAN", "PEAK", "VRAM"]]
    for load in judged.loads:
        rows.append(
            [
                load.node,
                load.gpu,
                load.pci_bus_id or "-",
                held_by(load),
                f"{_num(load.activity_percent)} %" + (" (over)" if over(load, limits) else ""),
                f"{_num(load.peak_percent)} %",
                "-" if load.vram_mb is None else f"{_num(load.vram_mb)} MB",
            ]
        )
    return lines + columns(rows)


def status_json(status: GpuStatus) -> dict[str, Any]:
    """``gpuMetrics`` of ``pool status -o json``."""
    judged, limits = status.judged, status.limits
    return {
        "read": judged is not None,
        "error": status.error,
        "windowSeconds": limits.window_seconds,
        "inferenceLoadPercent": limits.inference_load_percent,
        "staleNodes": judged.stale if judged else [],
        "notes": judged.lines if judged else [],
        "reservedGpus": [
            {
                "node": load.node,
                "gpu": load.gpu,
                "pciBusId": load.pci_bus_id or None,
                "heldBy": [
                    {"namespace": h.namespace, "name": h.name, "class": h.class_name or None, "inference": h.inference}
                    for h in load.holders
                ],
                "inference": load.inference,
                "meanActivityPercent": round(load.activity_percent, 1),
                "peakActivityPercent": round(load.peak_percent, 1),
                "vramMB": None if load.vram_mb is None else round(load.vram_mb, 1),
                "overInferenceLoad": over(load, limits),
            }
            for load in (judged.loads if judged else [])
        ],
    }
