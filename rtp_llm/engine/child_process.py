"""What a process that the server spawned (the engine process, a tensor-parallel worker) sets up first."""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional

_PR_SET_PDEATHSIG = 1


def become_child(parent: Optional[int] = None) -> None:
    """Dies with its parent and leaves group signals to it.

    A parent killed outright (SIGKILL, OOM) takes this process with it instead of leaving it holding the model's
    memory (Linux: PR_SET_PDEATHSIG; elsewhere the closed pipe still ends it). Ctrl-C and a supervisor's SIGTERM
    reach the whole process group: the parent decides how to stop (it drains, then tells this process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:  # the parent died before the prctl
        os._exit(1)
