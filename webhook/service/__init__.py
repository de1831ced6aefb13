"""The HTTPS admission service (``serve``): the ASGI app, TLS and its reloads, the policy
reloader, write coalescing, logs, metrics, certificates and the background audit it runs. The top
part: may import every other part except the CLI."""
