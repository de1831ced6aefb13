"""CPU time the hypervisor stole from this virtual machine, from /proc/stat.

On a virtual machine a vCPU that wants to run can be kept waiting while the host runs something else
on the physical CPU (another tenant, the hypervisor's own work). The guest kernel counts that time as
*steal*: the 8th counter of each ``cpu`` line of /proc/stat (user, nice, system, idle, iowait, irq,
softirq, steal, ...), in USER_HZ ticks (``os.sysconf("SC_CLK_TCK")``, normally 100 per second). A
server stalled that way is late for every request in the meantime, whatever its code.

A reading is the steal counter of each ``cpu`` line by its name: ``"cpu"`` (the sum over all CPUs),
``"cpu0"``, ``"cpu1"``, ...; ``None`` when /proc/stat is absent or has no steal column.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC_STAT = Path("/proc/stat")
STEAL = 8  # the steal counter's field on a ``cpu`` line, the line's name being field 0

Reading = dict[str, int]


def parse(text: str) -> Reading | None:
    """The steal counter of every ``cpu`` line of a /proc/stat text; ``None`` when there is none."""
    counters: Reading = {}
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0].startswith("cpu") and len(fields) > STEAL:
            counters[fields[0]] = int(fields[STEAL])
    return counters or None


def read(path: Path = PROC_STAT) -> Reading | None:
    try:
        return parse(path.read_text())
    except (OSError, ValueError):
        return None


def seconds(before: Reading | None, after: Reading | None, cpu: str | None) -> float | None:
    """Seconds stolen between two readings from CPU ``cpu`` (one CPU number, as given to ``taskset``),
    or from all CPUs together when ``cpu`` is None (the process was not pinned); None when unknown."""
    line = "cpu" if cpu is None else f"cpu{cpu}"
    if before is None or after is None or line not in before or line not in after:
        return None
    return (after[line] - before[line]) / os.sysconf("SC_CLK_TCK")


def stolen(
    before: Reading | None, after: Reading | None, server_cpu: str | None, client_cpu: str | None
) -> dict[str, float | None]:
    """``{"server": s, "client": s}``: seconds stolen from the servers' CPU and from the load generator's."""
    return {"server": seconds(before, after, server_cpu), "client": seconds(before, after, client_cpu)}
