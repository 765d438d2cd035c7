"""``python -m parity.repro FILE [--target T ...] [--out DIR]`` (same as ``parity repro``)."""

import sys

from parity.repro.cli import main

sys.exit(main())
