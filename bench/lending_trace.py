"""The pure parts of ``make bench-lending`` (bench/lending.py): the daily inference curve, the training backlog,
the work a borrower loses to an eviction, and the GPU-hour accounting of the samples. No clock, no cluster:
tests/bench/test_bench_lending.py checks them.

Time here is *trace* time in hours (a day is 24 h); the bench maps it to real time by its time factor.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

DAY_HOURS = 24.0
DEVICE_PLUGIN = "device-plugin"
DRA = "dra"
ROUTES = (DEVICE_PLUGIN, DRA)


# --- the inference curve ------------------------------------------------------------------------------


def _shape_mean(power: int) -> float:
    """The mean over a period of ((1 + cos x) / 2) ** power: C(2k, k) / 4**k."""
    return float(math.comb(2 * power, power)) / float(4**power)


@dataclass(frozen=True)
class DailyCurve:
    """The fraction of the reserved GPUs inference wants, over a day: one smooth peak at ``peak_hour`` that fills
    them (1.0), a trough at ``peak_hour`` ± 12 h, and a mean of ``mean`` over the day.

    ``floor + (1 - floor) * ((1 + cos(2π (h - peak) / 24)) / 2) ** k``: the shape's own mean is C(2k, k)/4^k
    (k=1: 0.5, k=2: 0.375, k=3: 0.3125...); k is the smallest power whose shape mean is at most ``mean``, and
    ``floor`` lifts the curve to that mean exactly (the mean of a peak of 1 over a floor)."""

    mean: float = 0.4
    peak_hour: float = 14.0

    def __post_init__(self) -> None:
        if not 0.0 < self.mean < 1.0:
            raise ValueError(f"mean {self.mean}: a fraction of the reserved GPUs, strictly between 0 and 1")

    @property
    def power(self) -> int:
        power = 1
        while _shape_mean(power) > self.mean:
            power += 1
        return power

    @property
    def floor(self) -> float:
        shape = _shape_mean(self.power)
        return (self.mean - shape) / (1.0 - shape)

    def fraction(self, hour: float) -> float:
        phase = 2.0 * math.pi * (hour - self.peak_hour) / DAY_HOURS
        shape = ((1.0 + math.cos(phase)) / 2.0) ** self.power
        return self.floor + (1.0 - self.floor) * shape

    def replicas(self, hour: float, most: int) -> int:
        """Replicas of ``most`` (each one holding the same share of the reserved GPUs) at ``hour``."""
        return max(0, min(most, round(self.fraction(hour) * most)))


# --- the training backlog --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """A training job: ``gpus`` GPUs for ``hours`` of trace time of work. ``route``: ``device-plugin`` (pods ask
    for ``amd.com/gpu``: only the whole reserved nodes serve it, so it runs only by borrowing) or ``dra`` (a
    ResourceClaimTemplate of ``gpu.amd.com``: the split nodes' shared devices, and their lendable ones where
    lending covers devices)."""

    id: int
    route: str
    gpus: int
    hours: float
    borrower: bool

    @property
    def name(self) -> str:
        return f"job-{self.id:04d}"


@dataclass(frozen=True)
class BacklogShape:
    jobs_per_route: int = 300
    # GPUs per job, drawn uniformly from these (a 4-GPU job fills a whole node; DRA jobs fit the 2 shared devices
    # of a split node).
    device_plugin_gpus: tuple[int, ...] = (1, 2, 2, 4, 4)
    dra_gpus: tuple[int, ...] = (1, 1, 2)
    # Work in trace hours, log-uniform between these.
    min_hours: float = 1.0
    max_hours: float = 8.0
    # The share of DRA jobs that borrow (every device-plugin job does: nothing else serves it).
    dra_borrowers: float = 0.5


def make_backlog(seed: int, shape: BacklogShape | None = None) -> list[Job]:
    """The jobs of both routes, interleaved, in submission order; the same seed gives the same backlog."""
    shape = shape or BacklogShape()
    rng = random.Random(seed)
    jobs: list[Job] = []
    for index in range(shape.jobs_per_route * len(ROUTES)):
        route = ROUTES[index % len(ROUTES)]
        sizes = shape.device_plugin_gpus if route == DEVICE_PLUGIN else shape.dra_gpus
        gpus = rng.choice(sizes)
        hours = math.exp(rng.uniform(math.log(shape.min_hours), math.log(shape.max_hours)))
        borrower = route == DEVICE_PLUGIN or rng.random() < shape.dra_borrowers
        jobs.append(Job(index + 1, route, gpus, round(hours, 3), borrower))
    return jobs


# --- work and checkpoints ----------------------------------------------------------------------------------


@dataclass
class Progress:
    """A job's work: ``done`` hours so far (kept across attempts up to the last checkpoint), ``saved`` at the
    last checkpoint. A checkpoint is written every ``checkpoint_hours`` of work (0: continuously, nothing is
    ever lost)."""

    job: Job
    checkpoint_hours: float
    done: float = 0.0
    saved: float = 0.0
    interruptions: int = 0

    def run(self, hours: float) -> None:
        """``hours`` more of work (never past the job's end)."""
        self.done = min(self.job.hours, self.done + max(0.0, hours))
        if self.checkpoint_hours <= 0 or self.finished:
            self.saved = self.done
        else:
            self.saved = max(self.saved, math.floor(self.done / self.checkpoint_hours) * self.checkpoint_hours)

    @property
    def finished(self) -> bool:
        return self.done >= self.job.hours - 1e-9

    @property
    def remaining(self) -> float:
        return max(0.0, self.job.hours - self.done)

    def interrupt(self) -> float:
        """Evicted or preempted: the work since the last checkpoint is lost (the job resumes from it). Returns
        the GPU-hours lost."""
        lost = self.done - self.saved
        self.done = self.saved
        self.interruptions += 1
        return lost * self.job.gpus


# --- samples and GPU-hours ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """What one sample saw, and the trace hours it stands for (up to the next sample)."""

    hour: float
    span_hours: float
    reserved: int
    inference: int
    borrowers: int
    # reserved GPUs held by borrowers that are terminating (taken back, within their grace period)
    reclaiming: int = 0
    # GPUs held by running training pods (borrowers or not, reserved or shared)
    training: int = 0
    nonborrowers_on_reserved: int = 0

    @property
    def idle(self) -> int:
        return max(0, self.reserved - self.inference - self.borrowers - self.reclaiming)


def gpu_hours(samples: Iterable[Sample], what: str) -> float:
    """The GPU-hours of one quantity of the samples (``idle``, ``inference``, ``borrowers``, ...): each sample's
    count times the trace hours it stands for."""
    return sum(float(getattr(s, what)) * s.span_hours for s in samples)


def spans(real_times: Sequence[float], end: float, time_factor: float) -> list[float]:
    """The trace hours each sample stands for: from its time to the next sample's (the last: to ``end``), real
    seconds times the time factor."""
    bounds = [*real_times[1:], end]
    return [max(0.0, (b - a) * time_factor / 3600.0) for a, b in zip(real_times, bounds, strict=True)]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


# --- one run's result, and the figures of the two ----------------------------------------------------------


@dataclass
class RunResult:
    mode: str
    samples: list[Sample] = field(default_factory=list)
    bind_seconds: list[float] = field(default_factory=list)
    bind_seconds_whole: list[float] = field(default_factory=list)  # of the whole nodes' Deployment
    bind_seconds_split: list[float] = field(default_factory=list)  # of the split nodes' Deployment
    inference_unbound: int = 0
    inference_evicted: int = 0
    nonborrowers_on_reserved: int = 0
    jobs_finished: int = 0
    jobs_started: int = 0
    interruptions: int = 0
    lost_gpu_hours: float = 0.0
    wall_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        bind = self.bind_seconds
        return {
            "reserved_gpu_hours": round(gpu_hours(self.samples, "reserved"), 1),
            "inference_gpu_hours": round(gpu_hours(self.samples, "inference"), 1),
            "idle_reserved_gpu_hours": round(gpu_hours(self.samples, "idle"), 1),
            "borrowed_gpu_hours": round(gpu_hours(self.samples, "borrowers"), 1),
            "reclaiming_gpu_hours": round(gpu_hours(self.samples, "reclaiming"), 1),
            "training_gpu_hours": round(gpu_hours(self.samples, "training"), 1),
            "jobs_finished": self.jobs_finished,
            "jobs_started": self.jobs_started,
            "interruptions": self.interruptions,
            "lost_gpu_hours": round(self.lost_gpu_hours, 2),
            "inference_pods_bound": len(bind),
            "inference_unbound": self.inference_unbound,
            "inference_bind_p50_s": _rounded(percentile(bind, 50)),
            "inference_bind_p99_s": _rounded(percentile(bind, 99)),
            "inference_bind_max_s": _rounded(max(bind) if bind else None),
            "inference_bind_p99_whole_s": _rounded(percentile(self.bind_seconds_whole, 99)),
            "inference_bind_p99_split_s": _rounded(percentile(self.bind_seconds_split, 99)),
            "inference_evicted": self.inference_evicted,
            "nonborrowers_on_reserved": self.nonborrowers_on_reserved,
            "wall_seconds": round(self.wall_seconds, 1),
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def summary(strict: RunResult, lending: RunResult, *, grace_s: int, time_factor: float, **extra: Any) -> dict[str, Any]:
    """The figures of issue 37 item 3, the required keys first (``borrowed_ratio``: borrowed GPU-hours under
    lending over idle reserved GPU-hours under strict), then each side's."""
    s, lend = strict.figures(), lending.figures()
    idle = s["idle_reserved_gpu_hours"]
    borrowed = lend["borrowed_gpu_hours"]
    return {
        "idle_reserved_gpu_hours": idle,
        "borrowed_gpu_hours": borrowed,
        "borrowed_ratio": round(borrowed / idle, 3) if idle else None,
        "inference_bind_p99_s": lend["inference_bind_p99_s"],
        "inference_bind_max_s": lend["inference_bind_max_s"],
        "grace_s": grace_s,
        "inference_evicted": s["inference_evicted"] + lend["inference_evicted"],
        "nonborrowers_on_reserved": s["nonborrowers_on_reserved"] + lend["nonborrowers_on_reserved"],
        "lost_gpu_hours": lend["lost_gpu_hours"],
        "time_factor": time_factor,
        **extra,
        "strict": s,
        "lending": lend,
    }
