"""simulator: the contract every package builds on (program, costs, calibration, errors, YAML loading) and the
SimPy engine with what reads its output (symmetry, timeline, metrics, exports). Imports nothing else of ours."""
from simulator.errors import ClusterSimError

__all__ = ["ClusterSimError"]
__version__ = "0.1.0"
