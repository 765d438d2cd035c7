"""The contract every side of a parity run shares, owned by none of them.

``engine/`` (our reimplementation), ``oracle/`` (the pinned upstream vLLM) and ``parity/`` (the
harness) all depend on this package; it depends on nothing but the standard library, so it also
runs inside an old upstream release's environment (a pin's worker process) and can be read by a
port written in another language:

- ``contract.trace``: ``StepTrace``, what one scheduler step did (the unit the scheduler tier
  compares), with its JSON form.
- ``contract.scripted``: the scripted test model: vocabulary, the pure-Python script of its
  greedy output, its tokenizer files, constructed weights, and the checkpoint builder.
- ``contract.protocol`` / ``contract.protocol_checks``: the scheduler-tier worker protocol
  (docs/scheduler-protocol.md): message shapes, encode/decode, version; ``contract.worker``: the
  serving loop of a Python worker.
- ``contract.profiles``: the table of deliberate divergence profiles (name, what it changes,
  upstream's behaviour, the signature it causes, the tiers it acts at).
"""
