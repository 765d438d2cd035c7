"""Hang reproduction (``parity repro``): repro files as legs, verdicts in seconds, records.

- ``spec``: the ``*.repro.yaml`` schema (``Repro``, ``Leg``) and ``load_repro`` (file:line).
- ``hold``: ``HoldingTransport``, which keeps a stalled request outstanding after its verdict.
- ``evidence``: the scheduler dump, py-spy stack dump and SIGTERM-while-wedged record.
- ``run``: ``run_repro`` -> ``ReproRun`` (one ``TargetLeg`` per leg and target).
- ``verdict``: outcome classes (``self_preemption_wedge``, ``saturation_queueing``, ...).
- ``diverge``: divergences between targets per leg, with their signatures.
- ``format``: pure text and Markdown; ``cli``: ``add_repro_commands(subparsers)``.
"""
