"""The pod's runtime sidecar: load windows, placement pushes, health and Prometheus metrics."""
