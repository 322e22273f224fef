"""One exception family for everything clustersim reports to a user.

Every error a user can cause (bad plan, unknown preset, corrupt trace, deadlocked program) is a
``ClusterSimError`` subclass whose message says what is wrong, where, and how to fix it. The CLI turns
any of them into a one-line message and exit code 2.
"""


class ClusterSimError(Exception):
    """Base class of every error clustersim reports to a user."""


class ConfigError(ClusterSimError):
    """Invalid user input: CLI flags, YAML experiment files, presets."""


class UnknownPresetError(ConfigError):
    """A preset name that does not exist; the message lists the known ones."""

    def __init__(self, what: str, name: str, known):
        self.what, self.name, self.known = what, name, sorted(known)
        super().__init__(f"unknown {what} preset {name!r}; known: {', '.join(self.known)}")


class PlanError(ConfigError):
    """A parallel plan that cannot run (product of degrees != GPUs, tp > heads, ...)."""


class TopologyError(ClusterSimError):
    """A network graph or placement problem (disconnected graph, unplaced rank, bad bandwidth)."""


class ProgramError(ClusterSimError):
    """A program that fails static validation (dangling/cyclic deps, mismatched collectives)."""


class DeadlockError(ClusterSimError):
    """The engine ran out of events while ops remain; the message names every blocked rank."""

    def __init__(self, message: str, blocked=None):
        super().__init__(message)
        self.blocked = blocked or []


class TraceError(ClusterSimError):
    """A trace file that cannot be read: corrupt, truncated, or missing required fields."""


class ResourceLimitError(ClusterSimError):
    """A simulation that would exceed the memory or event budget."""


class DeviceFailureError(ClusterSimError):
    """A device failed during the step; the message names the ranks blocked and where (watchdog view)."""

    def __init__(self, message: str, blocked=None):
        super().__init__(message)
        self.blocked = blocked or []


class OutputError(ClusterSimError):
    """An output that cannot be written (full disk, permissions, a non-empty --out); names the file."""
