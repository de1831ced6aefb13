"""The offline dry run (``mutate``): manifests read as kubectl reads them, the pod templates of
each workload kind, the decisions applied back. No cluster, no server: may import ``core`` only."""
