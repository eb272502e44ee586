"""Worker threads for tests that cannot lose a failure.

An exception in a plain threading.Thread only prints a warning, and a
join(timeout) that times out returns silently: a test could pass while its
workers failed or hung. running() re-raises the first exception of any
worker in the test and fails when a worker is still running at its deadline.
"""
import contextlib
import threading
import time


@contextlib.contextmanager
def running(*targets, stop=None, timeout=120.0):
    """Runs each callable in its own thread for the duration of the with
    block; then sets the event `stop` (when given) and waits for all of them
    (timeout seconds in all)."""
    errors = []

    def guarded(target):
        try:
            target()
        except BaseException as e:      # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    workers = [threading.Thread(target=guarded, args=(t,), daemon=True,
                                name=getattr(t, "__name__", "worker")) for t in targets]
    for worker in workers:
        worker.start()

    def finish():
        if stop is not None:
            stop.set()
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    try:
        yield
    except BaseException as body_error:
        finish()
        # A worker's failure is usually why the body failed too.
        if errors:
            raise errors[0] from body_error
        raise
    finish()
    hung = [w.name for w in workers if w.is_alive()]
    assert not hung, f"worker threads still running after {timeout} s: {hung}"
    if errors:
        raise errors[0]


def run(*targets, timeout=120.0):
    """Runs the callables in threads at once and waits for all of them."""
    with running(*targets, timeout=timeout):
        pass
