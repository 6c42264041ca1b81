"""kvjudge: probe what fits, budget tokens, reduce and tier agent runs, and judge them on your own hardware."""

from kvjudge.errors import KvjudgeError

__version__ = "0.1.0"
__all__ = ["KvjudgeError", "__version__"]
