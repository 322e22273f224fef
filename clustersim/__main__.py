"""``python -m clustersim ...`` runs the CLI (as the console script does)."""
from clustersim.cli import entry

entry()
