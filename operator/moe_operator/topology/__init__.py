"""Topology: which NVLink domain, rack and nodes every engine instance gets."""
