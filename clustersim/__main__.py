"""``python -m clustersim ...`` runs the CLI."""
from clustersim.cli import exit_process, main

exit_process(main())
