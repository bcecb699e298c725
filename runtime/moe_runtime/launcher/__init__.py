"""Starts SGLang for one pod of an engine instance: command line, init placement, supervision."""
