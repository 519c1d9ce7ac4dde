"""Quiet by default: the terminal shows Gyre's own lines; ``--verbose`` shows everything.

A real run starts third-party stacks (SGLang, torch, Megatron, Mooncake,
transformers) whose warnings and log lines drowned the CPU demo's own lines
(the issue counted 58 of its 138 stderr lines). ``quiet_third_parties()`` runs
before anything starts:

- in this process, warnings raised from modules outside ``gyre`` are not
  shown, and the named third-party loggers show warnings only when they are
  errors (``logging.ERROR``);
- for the processes it starts (training cells, engines, the proxy), which
  inherit the environment: Mooncake logs errors only, torch's C++ log
  errors only, transformers errors only, no tokenizers fork warning,
  and Python warnings off only for the named Megatron fallback messages
  (those processes run Gyre's own code too, whose warnings still show).
  A value already in the environment is kept (whoever set it wants it).

Each engine's own output is already in ``WORKDIR/engine-logs``; nothing here
hides a line Gyre writes: its progress, its errors and its own warnings
(``gyre.*`` modules) still show. Measured on the CPU demo at 4 steps: 77
stderr lines with ``--verbose``, 21 without, of which 6 are third-party:
each training cell's Mooncake transfer engine logs one error-level line
(``Local segment descriptor not found``, harmless on one machine) and glog's
notice that it logs before initialisation; filtering them would need the
cells' stderr sent to a log file.

Invariants: ``quiet_third_parties(verbose=True)`` changes nothing; otherwise
it only adds environment entries that are absent and filters that name
modules outside ``gyre``; calling it twice is the same as once.
"""

from __future__ import annotations

import logging
import os
import warnings

#: what the processes a run starts inherit (only where unset)
QUIET_ENVIRONMENT = {
    "MC_LOG_LEVEL": "ERROR",          # Mooncake's own level (TRACE, INFO, WARNING, ERROR): no W... lines
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "TRANSFORMERS_VERBOSITY": "error",
    "TOKENIZERS_PARALLELISM": "false",  # the fork warning of tokenizers
    # the training cells' Megatron fallbacks on a machine without Transformer Engine or Apex (measured on the
    # CPU demo: 3 lines per cell and import); by message prefix, so Gyre's own warnings still show there
    "PYTHONWARNINGS": ",".join(f"ignore:{prefix}" for prefix in (
        "Transformer Engine and Apex are not installed", "Apex is not installed", "full scope is deprecated")),
}
THIRD_PARTY_LOGGERS = ("sglang", "torch", "megatron", "transformers", "mooncake", "ray", "urllib3", "filelock",
                       "httpx", "datasets")


def quiet_third_parties(verbose: bool = False) -> None:
    """Filter third-party warnings and logs (module docstring); ``verbose``: leave everything as is."""
    if verbose:
        return
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    warnings.filterwarnings("ignore", module=r"(?!gyre(\.|$))")
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
