"""storage/background.py: a submit from within submit (a finalizer run by a garbage
collection) runs in the caller instead of waiting on the executor's own locks."""
from __future__ import annotations


def test_a_submit_from_within_submit_runs_in_the_caller():
    """A finalizer that a garbage collection runs inside background.submit (a collected
    connection closing its store) must not wait on the executor's own locks: the nested call
    gets None and runs its work itself (it hung a test run)."""
    import gc
    import weakref
    from tensordb.storage import background
    ran = []

    class Owner:
        pass

    def nested():
        ran.append(background.submit(ran.append, "helper"))

    owner = Owner()
    weakref.finalize(owner, nested)
    cycle = [owner]
    cycle.append(cycle)
    del owner, cycle

    def collect_then_work():
        return "done"
    real = background.ThreadPoolExecutor.submit

    def submit_with_collection(self, fn, *args):
        gc.collect()  # the finalizer runs here, inside our submit
        return real(self, fn, *args)
    background.ThreadPoolExecutor.submit = submit_with_collection
    try:
        job = background.submit(collect_then_work)
    finally:
        background.ThreadPoolExecutor.submit = real
    assert job.result(timeout=10) == "done"
    assert ran == [None]  # the nested submit declined: its caller runs the work
    job = background.submit(collect_then_work)
    assert job.result(timeout=10) == "done"
