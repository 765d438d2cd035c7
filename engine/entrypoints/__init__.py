"""The serving layer: the OpenAI-compatible HTTP server and its command line (``vllm/entrypoints``)."""
