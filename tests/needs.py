"""What a test needs installed: without it a test is skipped on a developer's machine, and under
CI=true (`.ci/run` installs everything the extras name) the missing piece is a failure, since a
skip there would hide a broken install. A CPU feature the machine lacks stays a skip everywhere
(`cpu_feature`): the machine, not the install, decides it."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI") == "true"


def needs(missing: bool, reason: str):
    """A skipif mark where `missing`; under CI=true a failure named by `reason`, raised where
    the mark is made (the test module's collection, or the test's definition, fails)."""
    if missing and IN_CI:
        pytest.fail(f"CI=true, but {reason}", pytrace=False)
    return pytest.mark.skipif(missing, reason=reason)


def need_module(name: str, reason: str | None = None):
    """The module `name`, imported; skipped without it (a failure under CI=true)."""
    try:
        return pytest.importorskip(name, reason=reason)
    except pytest.skip.Exception:
        if IN_CI:
            pytest.fail(f"CI=true, but {name} is not installed" + (f": {reason}" if reason
                                                                   else ""), pytrace=False)
        raise


def cpu_feature(present: bool, feature: str):
    """A skipif mark naming the CPU feature the test needs, where this CPU lacks it."""
    return pytest.mark.skipif(not present, reason=f"this CPU lacks {feature}")


def held_below_cpu() -> bool:
    """Whether ATEN_CPU_CAPABILITY holds torch's ATen kernels below this CPU's own instruction
    set (an AVX512 CPU run as an AVX2 one, to measure what AVX2 machines do)."""
    held = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    if held not in ("avx2", "default"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return " avx512f" in f.read()
    except OSError:
        return False
