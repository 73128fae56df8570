"""storage/_duck.py ``held_interrupt`` (review rev39a): a Ctrl-C that comes while a block is
held is raised when the outermost block ends, the SIGINT handler is the one from before every
block (after an exception inside, nested blocks, another thread), never lost. Real signals
(os.kill of this process), checked against the handler Python had."""
from __future__ import annotations

import os
import signal
import threading
import types

import pytest

from tensordb.storage import _duck
from tensordb.storage._duck import held_interrupt


def _sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_a_ctrl_c_held_is_raised_after_the_block_and_the_handler_restored():
    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt):
        with held_interrupt():
            _sigint()
            done.append(1)  # the block runs to its end
    assert done == [1] and signal.getsignal(signal.SIGINT) is before


def test_an_exception_inside_keeps_its_own_and_restores_the_handler():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(ValueError):
        with held_interrupt():
            _sigint()
            raise ValueError("inside")
    assert signal.getsignal(signal.SIGINT) is before


def test_another_thread_swaps_nothing():
    before, seen = signal.getsignal(signal.SIGINT), []

    def body():
        with held_interrupt():
            seen.append(signal.getsignal(signal.SIGINT))
    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [before] and signal.getsignal(signal.SIGINT) is before


def test_a_ctrl_c_as_a_nested_block_starts_reaches_the_outermost(monkeypatch):
    """A SIGINT that arrives while a nested block is entering (after its first look at the
    handler) is the outer block's: raised when the outer block ends. The nested block used to
    install itself as the handler for a moment and put the outer one back: a Ctrl-C in that
    moment was noted on the nested block, which holds nothing, and was lost."""
    real = signal
    state = {"outer": None, "fired": False}

    def fire_once():
        if state["outer"] is not None and not state["fired"]:
            state["fired"] = True
            _sigint()  # Python runs the handler at the next bytecode: inside __enter__

    def _signal(sig, handler):
        old = real.signal(sig, handler)
        if isinstance(handler, held_interrupt) and handler is not state["outer"]:
            fire_once()
        return old

    def _getsignal(sig):
        got = real.getsignal(sig)
        fire_once()
        return got
    proxy = types.SimpleNamespace(SIGINT=real.SIGINT, signal=_signal, getsignal=_getsignal)
    before = real.getsignal(real.SIGINT)
    outer = held_interrupt()
    with pytest.raises(KeyboardInterrupt):
        with outer:
            state["outer"] = outer
            monkeypatch.setattr(_duck, "signal", proxy)
            with held_interrupt():
                pass
            monkeypatch.setattr(_duck, "signal", real)
            assert state["fired"]
    assert real.getsignal(real.SIGINT) is before
