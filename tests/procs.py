"""Helpers for the CLI tests that drive loom processes."""
import os
import signal
import time


def kill_when(p, path, timeout=120):
    """SIGKILLs the process `p` as soon as `path` exists (or it ended, or `timeout` seconds passed);
    returns its exit status (-SIGKILL when it was killed mid-run)."""
    deadline = time.time() + timeout
    while not os.path.exists(path) and p.poll() is None and time.time() < deadline:
        time.sleep(0.001)
    p.send_signal(signal.SIGKILL)
    return p.wait()
