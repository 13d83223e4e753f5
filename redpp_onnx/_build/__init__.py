"""Build-time helpers (standard library only; used by setup.py)."""
