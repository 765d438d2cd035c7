"""OpenAI-compatible endpoints, mirroring ``vllm/entrypoints/openai`` at the pin."""
