"""clustersim's engine side: the program model (the contract), the SimPy engine, timeline, metrics, CLI."""
from simulator.errors import ClusterSimError

__all__ = ["ClusterSimError"]
__version__ = "0.1.0"
