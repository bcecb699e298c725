"""Tests of the MoEDeployment API, model catalog, capacity model and admission rules."""
