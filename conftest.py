"""Test-run options shared by the whole suite: slow and GPU tests are skipped by default."""
from __future__ import annotations

import importlib.util
import os
import sys

import pytest


# PYTHONDONTWRITEBYTECODE, where it is set (CI's environment sets it), kept any bytecode from
# being written: each pytest process rewrote every test module's asserts from source, and each of
# the suite's hundreds of child processes (kill -9 tests, the command line, memory-sampled
# children, Dask workers) compiled tensordb again on import. The tests write it (into the
# __pycache__ folders .gitignore leaves out); the children read what was written.
sys.dont_write_bytecode = False


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


def corpus_executor() -> str:
    """The executor the random corpora (tests/corpus/test_fuzz.py, tests/corpus/test_engine_corpus.py) run on:
    ``TENSORDB_TEST_EXECUTOR``, ``local`` when unset. ``gpu`` runs them with CuPy on a GPU
    (tests/bench/gpu_device.sh); there is no fallback: without a GPU they fail."""
    return os.environ.get("TENSORDB_TEST_EXECUTOR", "").strip() or "local"


def pytest_collection_modifyitems(config, items):
    run_slow = config.getoption("--runslow")
    gpu = None
    for item in items:
        # Markers, not keywords: keywords hold the names of the folders above a test too (a
        # checkout in a folder named gpu would skip every test).
        if item.get_closest_marker("slow") is not None and not run_slow:
            item.add_marker(pytest.mark.skip(reason="slow: run with --runslow"))
        if item.get_closest_marker("gpu") is not None:
            if gpu is None:
                gpu = gpu_available()
            if not gpu:
                item.add_marker(pytest.mark.skip(reason="needs CuPy and an NVIDIA GPU"))
