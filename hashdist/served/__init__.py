"""Served lists: what a deployed (approximate) index returns, made and evaluated against the exhaustive ranking."""
