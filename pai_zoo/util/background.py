"""One background thread for ordered writes, so that reading and transforming the next tensor
overlaps with writing the previous one (file writes release the GIL)."""
from __future__ import annotations

import queue
import threading


class BackgroundWriter:
    """Runs submitted calls in order on one thread; at most ``depth`` wait in the queue (which
    bounds the extra memory). An exception in a call is raised again by the next
    :meth:`submit` or by :meth:`close`."""

    def __init__(self, depth: int = 1):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._failed = False  # once a call failed (or the caller did), the calls still queued are skipped
        self._thread = threading.Thread(target=self._run, name="pai-zoo-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if not self._failed:
                fn, args = item
                try:
                    fn(*args)
                except BaseException as exc:  # re-raised in the caller's thread
                    self._error, self._failed = exc, True

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def submit(self, fn, *args) -> None:
        self._raise()
        self._queue.put((fn, args))

    def close(self) -> None:
        """Wait for every submitted call; raise the first error."""
        self._queue.put(None)
        self._thread.join()
        self._raise()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:  # drain without running what is queued, and without masking the original error
            self._failed = True
            self._queue.put(None)
            self._thread.join()
