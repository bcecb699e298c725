"""Pure functions from a spec and a topology plan to Kubernetes objects (dicts)."""
