"""Served result lists of a deployed index, evaluated against the exhaustive Hamming ranking (docs/served.md,
spec section 5d). The package spans the levels of docs/architecture.md, a module per level:

- ``lists``: reading and checking the lists a user hands in (files or arrays): data level;
- ``pairs``: the served entries' Hamming distances and grades, recomputed from the codes: kernel level;
- ``measures``: neighbour recall, the served histogram S and every top-K measure on it: metric level;
- ``engine``: the served ids' codes read from the dataset, the lists checked against them: engine level;
- ``report``: the served runs' table, figure and per-query arrays: report level;
- ``search``: served lists made with a faiss binary index (``hashdist search``): API level.

This ``__init__`` imports nothing, so that importing one level never loads the others.
"""
