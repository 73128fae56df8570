"""The pool's ready queues: one heap per worker, all under one lock.

A worker takes its best item: the lowest ``(class, rank)``, where aggregation folds (class 0) come
before task runs (class 1), and ranks are the plan's memory-aware order (``physical/order.py``).
Before a run item is taken, its run may refuse it for now (``admit``: the memory budget, see
``budget.py``); the worker then sleeps until something is put or released (``wake``).

A worker with nothing to take marks itself sleeping (under the lock) and sleeps on a SimpleQueue
of tokens (C code, no Python condition variable per item); a put for it or a wake sends it one
token, which says only "look again". A busy worker gets no tokens: it looks at its heap after
every item anyway.

The thread that started a run may serve one worker's heap itself while the run goes (``claim``,
``take``, ``release``): that worker's thread then takes nothing from it (it sleeps on), and the
puts for that worker wake the calling thread instead (its own token queue). A run so saves the
wake-up of one worker thread at its start and of the caller at its end.
"""
from __future__ import annotations

import heapq
import itertools
import queue
import threading

__all__ = ["ReadyQueues", "STOP"]

STOP = (-1, -1)  # the priority of the item that ends a worker thread (None)


class ReadyQueues:
    def __init__(self, workers: int) -> None:
        self.lock = threading.Lock()
        self.heaps: list[list] = [[] for _ in range(workers)]
        self.tokens = [queue.SimpleQueue() for _ in range(workers)]
        self.sleeping: set[int] = set()  # workers that found nothing to take
        self._seq = itertools.count()  # ties keep the order items were put in
        self.caller: int | None = None  # the heap the calling thread serves (``claim``)
        self.caller_tokens = queue.SimpleQueue()
        self.caller_sleeping = False

    def __len__(self) -> int:
        return len(self.heaps)

    def put(self, w: int, priority: tuple, item) -> None:
        with self.lock:
            heapq.heappush(self.heaps[w], (priority, next(self._seq), item))
            if w == self.caller:
                if not self.caller_sleeping:
                    return
                self.caller_sleeping = False
                tokens = self.caller_tokens
            elif w not in self.sleeping:
                return
            else:
                self.sleeping.discard(w)
                tokens = self.tokens[w]
        tokens.put(None)

    def put_many(self, items) -> None:
        """``put`` of each ``(w, priority, item)`` under one hold of the lock, the sleeping
        workers woken after the last."""
        with self.lock:
            heaps, seq, wake = self.heaps, self._seq, set()
            for w, priority, item in items:
                heapq.heappush(heaps[w], (priority, next(seq), item))
                wake.add(w)
            caller = self.caller in wake and self.caller_sleeping
            if caller:
                self.caller_sleeping = False
            wake &= self.sleeping
            wake.discard(self.caller)
            self.sleeping -= wake
        for w in wake:
            self.tokens[w].put(None)
        if caller:
            self.caller_tokens.put(None)

    def idle(self, w: int) -> list[int]:
        """The workers other than ``w`` with nothing queued (running their last item, or
        asleep: those first): those a run's tail call may be cut for (``tail.py``)."""
        with self.lock:
            free = [v for v, heap in enumerate(self.heaps) if v != w and not heap]
            return sorted(free, key=lambda v: v not in self.sleeping)

    def take_back(self, w: int, item) -> bool:
        """Remove ``item`` (the very object put) from worker ``w``'s heap if it is still
        there: True when it was, and ``w`` will never take it."""
        with self.lock:
            heap = self.heaps[w]
            for i, entry in enumerate(heap):
                if entry[2] is item:
                    heap[i] = heap[-1]
                    heap.pop()
                    heapq.heapify(heap)
                    return True
        return False

    def get(self, w: int):
        """Worker ``w``'s best item, once its run admits it (``item[0].admit(item)``, called
        under the lock); None ends the worker."""
        heap, lock, tokens = self.heaps[w], self.lock, self.tokens[w]
        while True:
            with lock:
                if heap and self.caller != w:  # (a claimed heap is the caller's)
                    item = heap[0][2]
                    if item is None or item[0].admit(item):
                        heapq.heappop(heap)
                        return item
                self.sleeping.add(w)
            tokens.get()  # sleep until something is put for it or released

    def claim(self, w: int) -> None:
        """The calling thread serves heap ``w`` until ``release`` (``take``); ``w``'s
        thread takes nothing from it meanwhile."""
        with self.lock:
            self.caller, self.caller_sleeping = w, False
        while True:  # tokens left from an earlier claim say nothing now
            try:
                self.caller_tokens.get_nowait()
            except queue.Empty:
                break

    def take(self, w: int, timeout: float):
        """The calling thread's next item of its claimed heap ``w`` (admitted as ``get``
        admits), or None when none came within ``timeout`` seconds (or a wake came)."""
        heap = self.heaps[w]
        with self.lock:
            if heap:
                item = heap[0][2]
                if item[0].admit(item):
                    heapq.heappop(heap)
                    return item
            self.caller_sleeping = True
        try:
            self.caller_tokens.get(timeout=timeout)
        except queue.Empty:
            pass
        return None

    def release(self) -> None:
        """The calling thread serves no heap any more: what is left in it is its worker's
        thread's again (woken if it has something)."""
        with self.lock:
            w, self.caller, self.caller_sleeping = self.caller, None, False
            if w is None or not self.heaps[w] or w not in self.sleeping:
                return
            self.sleeping.discard(w)
        self.tokens[w].put(None)

    def nudge(self) -> None:
        """Wake the calling thread if it sleeps in ``take`` (its run has finished)."""
        with self.lock:
            if not self.caller_sleeping:
                return
            self.caller_sleeping = False
        self.caller_tokens.put(None)

    def wake(self) -> None:
        """Memory was released or a task ended: workers waiting for room look again."""
        with self.lock:
            sleeping = list(self.sleeping)
            self.sleeping.clear()
            caller, self.caller_sleeping = self.caller_sleeping, False
        for w in sleeping:
            self.tokens[w].put(None)
        if caller:
            self.caller_tokens.put(None)
