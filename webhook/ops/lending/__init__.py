"""Lending idle reserved GPUs: which reserved nodes take no new borrowers and which borrowers make room for a
waiting inference pod (``decisions.py``), and inference's demand on the reserved pool (``demand.py``). Pure:
``serve``'s keeper reads and writes. May import the shared modules of ``ops`` only."""
