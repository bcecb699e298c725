"""Shared fixtures: the session-wide sandbox (moe_sandbox.testing) and the real operator
(operator_plugin, also loaded by e2e/scenarios so one session runs one operator)."""

pytest_plugins = ["moe_sandbox.testing", "operator_plugin"]
