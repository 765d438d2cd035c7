"""``python -m parity.bench`` (see parity/bench/cli.py)."""

from parity.bench.cli import main

raise SystemExit(main())
