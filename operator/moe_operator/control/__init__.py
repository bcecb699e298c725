"""The expert-placement control loop's pure parts: windows -> history -> plan -> decide -> publish.

No I/O here; handlers/control_loop.py is the kopf + HTTP shell around these functions.
"""
