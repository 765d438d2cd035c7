"""``python -m engine serve MODEL_DIR [flags]`` (``vllm serve``'s flags; see engine/entrypoints/cli.py)."""

from engine.entrypoints.cli import main

raise SystemExit(main())
