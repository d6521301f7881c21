"""``python -m harness``: the CLI, as launchers run it (``accelerate launch -m harness run ...``, ``torchrun -m``)."""

import sys

from harness.cli.main import main

sys.exit(main())
