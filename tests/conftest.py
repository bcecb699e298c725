"""Shared fixtures: the session-wide sandbox control plane lives in moe_operator.sandbox.testing."""

pytest_plugins = ["moe_operator.sandbox.testing"]
