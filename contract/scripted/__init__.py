"""The scripted test model: a tiny Llama checkpoint whose greedy output is known in advance.

- ``vocab``: token ids and strings; ``script``: the pure-Python script (``expected``, ``ranked``,
  ``next_token``); ``weights``: the constructed weights; ``tokenizer``: the tokenizer files;
  ``builder``: ``build(variant, out, seed)`` writes a model folder.

Docs: docs/scripted-model.md. Submodules are imported explicitly (the builder's random variant needs
torch; nothing else does).
"""
