"""Kubernetes operator for Mixture-of-Experts inference with cluster-level expert placement."""

__version__ = "0.1.0"
