"""Reading the cluster: the watch cache that ``serve`` answers from, the raw-JSON API client,
the inventory of nodes, pods and claims that ``audit`` and ``pool`` read, the Lease. May import
``core`` only."""
