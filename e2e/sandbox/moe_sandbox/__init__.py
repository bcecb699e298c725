"""A real local Kubernetes control plane with simulated GPU node pools, for users and tests."""
