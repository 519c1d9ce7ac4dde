"""Gyre: elastic RL for long-horizon LLM agents.

``gyre`` itself is the pure policy core (no I/O, no clock, no heavy imports);
``gyre.sim`` drives it from traces in a discrete-event simulator and
``gyre.real`` drives it over real engines and training cells.
"""

__version__ = "0.1.0"
