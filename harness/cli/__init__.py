"""The ``harness`` command (``harness.cli.main``)."""
