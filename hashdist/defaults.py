"""Defaults shared by the API, the CLI, the flows and the comparison (one place to change them)."""

DEFAULT_K = (10, 100, 1000)  # cut-offs K of the @K metrics
DEFAULT_RADII = (0, 1, 2)  # Hamming radii of the radius metrics and mLGAP
DEFAULT_BETA = 1.0  # F-beta's beta
DEFAULT_QUERY_BLOCK_ROWS = 2048
DEFAULT_DB_BLOCK_ROWS = 262144
DEFAULT_DISTANCE_BINS = 4096  # bins of a real-valued ranking distance (weighted Hamming, asymmetric)
