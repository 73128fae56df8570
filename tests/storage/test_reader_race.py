"""The one failure of test_concurrent_readers' writer-and-reader test (its SQL join of A and B
returned no row, so no B values): the reader had read the writer's first version, A = B = 0
everywhere, whose SQL views hold no rows (a tensor's view lists its nonzeros only). A whole
committed version, not a race: the writer process had not committed its first step by the time
the reader's three calls ran (its main thread descheduled under load; with the writer at nice
19 beside three busy processes, every one of 21 runs read version 0). Here that state is made
on purpose, a writer process that has committed version 0 only and stays open, and the test's
check (joined_version) is run against it; and the check still refuses a half version."""
from __future__ import annotations

import subprocess
import textwrap

import numpy as np
import pytest

import tensordb
from tests.harness import kill9, start_script
from tests.storage.test_concurrent_readers import N, joined_version

# test_concurrent_readers' WRITER up to its "ready", then idle: version 0 stays the newest
FIRST_VERSION_ONLY = textwrap.dedent("""
    import sys, numpy as np, tensordb
    con = tensordb.connect(sys.argv[1])
    con.load("A", np.zeros((64, 64)), tile=(16, 16), replace=True)
    con.execute("B[i,j] = A[i,j] * 2")
    print("ready", flush=True)
    sys.stdin.read()
    con.close()
""")


def test_a_reader_beside_a_writer_that_committed_only_zeros_passes_the_join_check(tmp_path):
    root = str(tmp_path / "db")
    writer = start_script(FIRST_VERSION_ONLY, root, stdin=subprocess.PIPE)
    try:
        assert writer.stdout.readline().strip() == b"ready"
        with tensordb.connect(root, read_only=True) as con:
            assert not con.store.view.own  # the writer's published snapshot, as in that test
            a = con.tensor("A")
            np.testing.assert_array_equal(a, np.zeros((N, N)))
            both = con.einsum("ij,ij->ij", "A", "B")
            np.testing.assert_array_equal(both, np.einsum("ij,ij->ij", a, 2 * a))
            # what the old check got: no row, so None for every value (and 2 * None raised)
            rows = con.execute("SELECT min(A.value), max(A.value), min(B.value), "
                               "max(B.value), count(*) FROM A JOIN B USING (i, j)").fetchall()
            assert rows == [(None, None, None, None, 0)]
            assert joined_version(con, 0) == 0  # the check now reads it as version 0
            with pytest.raises(AssertionError):  # yet not after a newer version was read
                joined_version(con, 1)
        writer.communicate(b"", timeout=60)
        assert writer.returncode == 0
    finally:
        if writer.poll() is None:
            kill9(writer)


@pytest.mark.parametrize("a, b", [(1.0, 0.0), (1.0, 3.0), (0.0, 2.0)])
def test_the_join_check_refuses_a_half_version(tmp_path, a, b):
    """A = a and B = b read in one statement, not B = 2 A: B from another commit than A (B
    still all zeros, or a later A's B) or A behind B (A still zeros) is refused."""
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.load("A", np.full((N, N), a), tile=(16, 16))
        con.load("B", np.full((N, N), b), tile=(16, 16))
        with pytest.raises(AssertionError):
            joined_version(con, 0)


def test_the_join_check_reads_a_whole_version(tmp_path):
    with tensordb.connect(str(tmp_path / "db")) as con:
        con.load("A", np.full((N, N), 3.0), tile=(16, 16))
        con.execute("B[i,j] = A[i,j] * 2")
        assert joined_version(con, 3) == 3
        with pytest.raises(AssertionError):  # older than a version read before
            joined_version(con, 4)
