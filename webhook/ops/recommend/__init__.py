"""Sizing the reservation from inference's measured demand: the demand gauges' history on one grid
(``history.py``), read from Prometheus (``fetch.py``), and the recommendation itself (``sizing.py``, pure).
May import ``lending`` (the demand gauges) and the shared modules of ``ops``."""
