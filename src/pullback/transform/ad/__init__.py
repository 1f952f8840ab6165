"""Reverse-mode AD internals: scan (diagnostics), inline (calls), sweep (adjoints)."""
