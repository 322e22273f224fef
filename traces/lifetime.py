"""Process lifetime: a child process that dies with its parent (used by ``collect`` for torchrun and ranks).

No torch here: the CLI side imports this without PyTorch.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG), so that no rank
    outlives torchrun, nor torchrun a killed clustersim; a no-op elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)          # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:                             # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
    except (OSError, AttributeError):
        pass
