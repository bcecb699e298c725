"""Capacity that follows load: the autoscaler's pure parts (signals -> model -> decision).

No I/O here: a pool's SGLang metrics come in as text or numbers, a decision (instances per
pool, a width recommendation, the numbers behind it) goes out. handlers/autoscale_loop.py is
the shell that scrapes, calls ``decide`` and writes status.
"""
