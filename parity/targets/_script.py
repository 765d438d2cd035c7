"""The script both scheduler-tier targets sample from.

Both fake runners keep one incremental ``ScriptState`` per request (``contract.scripted.script``),
and the script memoises its rankings process-wide, so the module itself is the fastest shared
script: a whole-context cache on top would only force the runners back to O(n) calls.
"""

from __future__ import annotations

from types import ModuleType


def shared_script() -> ModuleType:
    """The script module (its ranking memo is shared by every target of the process)."""
    from contract.scripted import script

    return script
