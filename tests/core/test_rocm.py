"""webhook/core/rocm.py: the HSA_CU_MASK grammar (ROCr flag.cpp parse_masks) and which variables do
nothing or slow ROCm down."""

from __future__ import annotations

import pytest

from webhook.core import rocm


@pytest.mark.parametrize(
    "mask",
    [
        "0:0-51",
        "0:0",
        "1:0-8",  # the ROCr docs' example
        "0,2-4,7:0-15,32-47",
        "0,2-4,7:0x337F",
        "0,2-4,7:0-15,32-47;8-9:0x337F",
        "0:0-37;1:38-75",
        "0:0xf",
        "0:0XFF",
        " 0 : 0-51 ; 1 : 0x1 ",  # whitespace around sets and colons
        "0-3:0-303",
    ],
)
def test_valid_cu_masks(mask: str) -> None:
    assert rocm.cu_mask_errors(mask) == []


@pytest.mark.parametrize(
    ("mask", "errors"),
    [
        ("", ["the mask is empty"]),
        ("   ", ["the mask is empty"]),
        ("0:", ["set 1 ('0:') is not GPU_list:CU_list, e.g. 0:0-51"]),
        (":0-3", ["set 1 (':0-3') is not GPU_list:CU_list, e.g. 0:0-51"]),
        ("abc", ["set 1 ('abc') is not GPU_list:CU_list, e.g. 0:0-51"]),
        ("0:0x", ["set 1 ('0:0x') is not GPU_list:CU_list, e.g. 0:0-51"]),
        ("0:0xg1", ["set 1 ('0:0xg1') is not GPU_list:CU_list, e.g. 0:0-51"]),
        ("0:1:2", ["set 1 ('0:1:2') is not GPU_list:CU_list, e.g. 0:0-51"]),
        ("0:1-2-3", ["set 1 ('0:1-2-3') is not GPU_list:CU_list, e.g. 0:0-51"]),
        ("0:0x0", ["set 1: a CU mask of 0x0 enables no CU"]),
        ("0:0x0000", ["set 1: a CU mask of 0x0 enables no CU"]),
        ("0:5-3", ["set 1: CU list '5-3': range '5-3' runs backwards"]),
        ("3-1:0", ["set 1: GPU list '3-1': range '3-1' runs backwards"]),
        ("0,0:1", ["set 1: GPU index repeated"]),
        ("0-2,1:1", ["set 1: GPU index repeated"]),
        ("0:1,1", ["set 1: CU index repeated"]),
        ("0:0-4,3", ["set 1: CU index repeated"]),
        # ROCr rejects a GPU that appears in two sets (the second set and all after it are ignored).
        ("0,2-4,7:0-15,32-47;3-9:0x337F", ["set 2: GPU index repeated"]),
        (
            "0:1;;",
            ["set 2 ('') is not GPU_list:CU_list, e.g. 0:0-51", "set 3 ('') is not GPU_list:CU_list, e.g. 0:0-51"],
        ),
        # Every set is checked: ROCr drops the bad set *and every set after it*, silently.
        ("0:1;x;1:0x0", ["set 2 ('x') is not GPU_list:CU_list, e.g. 0:0-51", "set 3: a CU mask of 0x0 enables no CU"]),
    ],
)
def test_invalid_cu_masks(mask: str, errors: list[str]) -> None:
    assert rocm.cu_mask_errors(mask) == errors


@pytest.mark.parametrize("name", ["HSA_QUEUE_PRIORITY", "HIP_PRECISION_MODE", "HSA_AMD_PRECISION_LEVEL"])
@pytest.mark.parametrize("value", ["high", "0", ""])
def test_no_effect_variables_always_warn(name: str, value: str) -> None:
    (warning,) = rocm.variable_warnings(name, value)
    assert warning.startswith(f"{name} has no effect in ROCm: ")


def test_hsa_queue_priority_warning_names_the_real_mechanism() -> None:
    (warning,) = rocm.variable_warnings("HSA_QUEUE_PRIORITY", "high")
    assert "hipStreamCreateWithPriority" in warning
    assert "hsa_amd_queue_set_priority" in warning
    assert "DEBUG_HIP_IGNORE_STREAM_PRIORITY=0" in warning


def test_fictional_precision_variables_point_to_real_knobs() -> None:
    (warning,) = rocm.variable_warnings("HIP_PRECISION_MODE", "fp16")
    assert "does not exist" in warning and "ROCBLAS_INTERNAL_FP16_ALT_IMPL" in warning
    (warning,) = rocm.variable_warnings("HSA_AMD_PRECISION_LEVEL", "2")
    assert "does not exist" in warning


@pytest.mark.parametrize(
    ("name", "value", "warns"),
    [
        ("HIP_LAUNCH_BLOCKING", "1", True),
        ("HIP_LAUNCH_BLOCKING", "true", True),
        ("HIP_LAUNCH_BLOCKING", "0", False),
        ("HIP_LAUNCH_BLOCKING", " 0 ", False),
        ("HIP_LAUNCH_BLOCKING", "", False),
        ("AMD_SERIALIZE_KERNEL", "3", True),
        ("AMD_SERIALIZE_KERNEL", "0", False),
    ],
)
def test_slowing_variables_warn_only_when_enabled(name: str, value: str, warns: bool) -> None:
    warnings = rocm.variable_warnings(name, value)
    assert bool(warnings) is warns
    if warns:
        assert "debugging aid" in warnings[0]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HSA_CU_MASK", "0:0-51"),
        ("GPU_MAX_HW_QUEUES", "4"),
        ("ROCR_VISIBLE_DEVICES", "0,1"),
        ("HIP_FORCE_DEV_KERNARG", "1"),
        ("HSA_ENABLE_SDMA", "0"),
        ("HIP_VISIBLE_DEVICES", "0"),
    ],
)
def test_real_knobs_raise_no_warning(name: str, value: str) -> None:
    assert rocm.variable_warnings(name, value) == []
