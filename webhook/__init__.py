"""rocm-isolation-webhook: keeps GPU training off the AMD ROCm nodes reserved for inference."""

__version__ = "0.1.0"
