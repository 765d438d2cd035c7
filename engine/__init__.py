"""Our compact reimplementation of vLLM's v1 engine (pin: oracle/pin.py)."""
