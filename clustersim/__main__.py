"""``python -m clustersim ...`` runs the CLI."""
import sys

from clustersim.cli import main

sys.exit(main())
