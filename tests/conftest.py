"""Test configuration: under CI (CI=true) hypothesis runs derandomized, so a CI run is reproducible; locally
it explores new examples every run (run with CI=true to reproduce what CI sees)."""
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
