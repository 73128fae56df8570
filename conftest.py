"""Test-run options shared by the whole suite: slow and GPU tests are skipped by default."""
from __future__ import annotations

import importlib.util

import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run tests marked slow")


def gpu_available() -> bool:
    """CuPy imports and sees at least one GPU."""
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any CUDA failure means no usable GPU
        return False


def pytest_collection_modifyitems(config, items):
    run_slow = config.getoption("--runslow")
    gpu = None
    for item in items:
        if "slow" in item.keywords and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: run with --runslow"))
        if "gpu" in item.keywords:
            if gpu is None:
                gpu = gpu_available()
            if not gpu:
                item.add_marker(pytest.mark.skip(reason="needs CuPy and an NVIDIA GPU"))
