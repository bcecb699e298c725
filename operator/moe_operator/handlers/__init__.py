"""Thin kopf handlers: read indexes, call the pure planner and renderer, apply, write status."""
