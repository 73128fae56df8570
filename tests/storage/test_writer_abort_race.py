"""A writer aborted on one thread while others append tiles or abort it too (a run's failing
worker and the statement's own abort): ``TensorWriter._fail`` runs once, under the writer's lock,
so no descriptor is closed twice and no payload file is left behind by an append that raced it.

Real threads released together by a barrier, a real database under tmp_path. Oracles: the
payload directory listed from the file system (no file of the aborted version), the open
descriptors of the process (/proc/self/fd: none of the writer's left open, and a descriptor
opened by the test before the race is still the file it was), and the errors the losing threads
get (InterfaceError, the writer's "already aborted", nothing else)."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import scipy.sparse as sp

import tensordb
from tensordb.errors import InterfaceError

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"),
                                reason="the open descriptors are read from /proc")

ROWS, COLS, TILES = 64, 64, 8


def _tile(seed: int) -> sp.csr_array:
    t = sp.csr_array(sp.random(ROWS, COLS, density=0.1, format="csr", random_state=seed))
    t.data += 1.0
    return t


def _open_paths() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    return out


@pytest.mark.parametrize("first_written", [False, True])
def test_abort_racing_appends_and_aborts_leaves_no_file_and_closes_once(tmp_path, first_written):
    with tensordb.connect(tmp_path / "db") as con:
        store = con.store
        sentinel_path = tmp_path / "sentinel"
        sentinel_path.write_bytes(b"x")
        sentinel = os.open(sentinel_path, os.O_RDONLY)
        try:
            for round_ in range(40):
                w = store.writer(f"T{round_}", (ROWS * TILES, COLS), np.float64, (ROWS, COLS))
                if first_written:  # the file exists and its descriptor is open: abort closes it
                    assert w.write_tile((0, 0), _tile(round_))
                barrier = threading.Barrier(6)
                errors: list[BaseException] = []

                def append(r: int) -> None:
                    barrier.wait()
                    try:
                        w.write_tile((r, 0), _tile(100 * round_ + r))
                    except InterfaceError:
                        pass  # lost the race: the writer was aborted
                    except BaseException as exc:  # noqa: BLE001 - the assertion below names it
                        errors.append(exc)

                def abort() -> None:
                    barrier.wait()
                    try:
                        w.abort()
                    except BaseException as exc:  # noqa: BLE001
                        errors.append(exc)

                threads = [threading.Thread(target=append, args=(r,)) for r in range(1, 4)]
                threads += [threading.Thread(target=abort) for _ in range(3)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                assert errors == []
                assert not os.path.exists(w.path), f"round {round_}: an orphan payload file"
                assert w.path not in _open_paths()
                # the descriptor the test holds is still open and still its file
                assert os.readlink(f"/proc/self/fd/{sentinel}") == str(sentinel_path)
                with pytest.raises(InterfaceError, match="already aborted"):
                    w.write_tile((5, 0), _tile(1))
                assert not os.path.exists(w.path)
        finally:
            os.close(sentinel)
        assert [r["problem"] for r in con.check()] == ["ok"]  # no orphan payload file either


def test_abort_while_an_append_opens_the_file_leaves_no_orphan(tmp_path):
    """The window that made the orphan: an append found the writer open and was opening its
    payload file when an abort on another thread, finding no file yet, returned. A hook at the
    real open (the abort started there and given 0.3 s) makes the race happen every time: the
    abort now waits for the append's lock, then removes the file the append made."""
    with tensordb.connect(tmp_path / "db") as con:
        w = con.store.writer("T", (ROWS * TILES, COLS), np.float64, (ROWS, COLS))
        real_open = w._open_appended
        aborter: list[threading.Thread] = []

        def open_during_abort(first: int) -> int:
            t = threading.Thread(target=w.abort)
            aborter.append(t)
            t.start()
            t.join(0.3)  # before the fix the abort finished here, finding no file
            return real_open(first)

        w._open_appended = open_during_abort
        try:
            w.write_tile((0, 0), _tile(0))
        except InterfaceError:
            pass  # the abort won after all: the append says so
        aborter[0].join()
        assert not os.path.exists(w.path)
        assert w.path not in _open_paths()
        with pytest.raises(InterfaceError, match="already aborted"):
            w.write_tile((1, 0), _tile(1))
        assert [r["problem"] for r in con.check()] == ["ok"]
