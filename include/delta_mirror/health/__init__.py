"""Health: what a table's mirror is doing — status and lag, monitoring checks, circuit breakers,
and the troubleshooting hints attached to errors.
"""

__all__: list[str] = []
