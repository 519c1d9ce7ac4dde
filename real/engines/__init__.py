"""Rollout engines: the SGLang engine manager (``manager``).

Launches SGLang CPU or GPU engine processes, probes their health, quiesces
them, releases and resumes their memory for role transitions and loads new
weights. Talks to engines over their HTTP API only; imports nothing else of
``gyre.real``.
"""
