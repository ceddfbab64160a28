"""Macro-kernel: the cache-tiling loop nests (a template specialised per micro-kernel)."""
