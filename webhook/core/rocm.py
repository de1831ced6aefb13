"""What ROCm really does with the environment variables a policy may set.

Sources: ROCm/ROCR-Runtime@c7785a6 ``runtime/hsa-runtime/core/util/flag.h``/``flag.cpp``, ROCm/clr@f9f995c
``rocclr/utils/flags.hpp`` (docs/policy.md, "ROCm environment variables: what is real").
"""

from __future__ import annotations

import re

# Variables that no ROCm component reads: setting them is harmless but does nothing.
NO_EFFECT_VARIABLES: dict[str, str] = {
    "HSA_QUEUE_PRIORITY": (
        "no ROCm component reads HSA_QUEUE_PRIORITY from the environment; queue priority is set by the "
        "application (hipStreamCreateWithPriority, hsa_amd_queue_set_priority), and current HIP ignores "
        "stream priorities unless DEBUG_HIP_IGNORE_STREAM_PRIORITY=0"
    ),
    "HIP_PRECISION_MODE": (
        "HIP_PRECISION_MODE does not exist in HIP or ROCr; precision knobs are library-level "
        "(ROCBLAS_INTERNAL_FP16_ALT_IMPL, MIOPEN_DEBUG_CONVOLUTION_ATTRIB_FP16_ALT_IMPL)"
    ),
    "HSA_AMD_PRECISION_LEVEL": "HSA_AMD_PRECISION_LEVEL does not exist in ROCr or anywhere in ROCm",
}

# Variables that are real but slow things down; worth a warning when a policy sets them.
SLOWING_VARIABLES: dict[str, str] = {
    "HIP_LAUNCH_BLOCKING": (
        "HIP_LAUNCH_BLOCKING=1 waits for every kernel to finish (same as AMD_SERIALIZE_KERNEL=2): a "
        "debugging aid that slows inference down"
    ),
    "AMD_SERIALIZE_KERNEL": "AMD_SERIALIZE_KERNEL serialises kernel launches: a debugging aid only",
}

_ID_LIST = r"(?:\d+(?:-\d+)?)(?:,(?:\d+(?:-\d+)?))*"
_CU_SET = re.compile(rf"^\s*(?P<gpus>{_ID_LIST})\s*:\s*(?P<cus>{_ID_LIST}|0[xX][0-9a-fA-F]+)\s*$")


def _expand(id_list: str) -> list[int]:
    ids: list[int] = []
    for part in id_list.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high) if high else int(low)
        if last < first:
            raise ValueError(f"range {part!r} runs backwards")
        ids.extend(range(first, last + 1))
    return ids


def cu_mask_errors(mask: str) -> list[str]:
    """Problems with an ``HSA_CU_MASK`` value; empty when ROCr would accept all of it.

    Grammar (ROCR ``flag.cpp``): ``GPU_list:CU_list[;GPU_list:CU_list]*`` where an ID list is
    ``0,2-4,7`` and a CU list may instead be hex (``0x337F``). ROCr stops at the first bad set and
    silently ignores it and every set after it, so every set must be checked here. A mask of ``0x0``
    and repeated IDs are syntax errors too.
    """
    if not mask.strip():
        return ["the mask is empty"]
    errors: list[str] = []
    seen_gpus: set[int] = set()
    for index, cu_set in enumerate(mask.split(";"), start=1):
        match = _CU_SET.match(cu_set)
        if match is None:
            errors.append(f"set {index} ({cu_set.strip()!r}) is not GPU_list:CU_list, e.g. 0:0-51")
            continue
        try:
            gpus = _expand(match["gpus"])
        except ValueError as err:
            errors.append(f"set {index}: GPU list {match['gpus']!r}: {err}")
            continue
        if len(set(gpus)) != len(gpus) or seen_gpus.intersection(gpus):
            errors.append(f"set {index}: GPU index repeated")
        seen_gpus.update(gpus)
        cus = match["cus"]
        if cus.lower().startswith("0x"):
            if int(cus, 16) == 0:
                errors.append(f"set {index}: a CU mask of 0x0 enables no CU")
            continue
        try:
            cu_ids = _expand(cus)
        except ValueError as err:
            errors.append(f"set {index}: CU list {cus!r}: {err}")
            continue
        if len(set(cu_ids)) != len(cu_ids):
            errors.append(f"set {index}: CU index repeated")
    return errors


def variable_warnings(name: str, value: str, *, acknowledged: bool = False) -> list[str]:
    """Warnings (not errors) for a variable a policy sets; ``acknowledged``: the policy says it knows
    the variable has no effect (``acknowledgeNoEffect``)."""
    if name in NO_EFFECT_VARIABLES:
        if acknowledged:
            return []
        return [f"{name} has no effect in ROCm: {NO_EFFECT_VARIABLES[name]}"]
    if name in SLOWING_VARIABLES and value.strip() not in ("", "0"):
        return [SLOWING_VARIABLES[name]]
    return []
