"""``runtime.quiet``: third-party warnings and logs filtered by default, Gyre's own kept, ``--verbose`` all.

Checked: a warning from a module outside ``gyre`` is hidden and one from
``gyre.*`` still shows; third-party loggers drop to errors; the environment the
run's processes inherit gains the quiet settings only where unset; verbose
changes nothing; ``gyre run --verbose`` is accepted.
"""

from __future__ import annotations

import logging
import os
import warnings

from gyre.real.runtime.quiet import QUIET_ENVIRONMENT, quiet_third_parties


def shown(module: str) -> bool:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_parties()
        warnings.warn_explicit("careful", UserWarning, "x.py", 1, module=module)
    return bool(caught)


def test_third_party_warnings_are_hidden_and_gyres_shown(monkeypatch):
    for name in QUIET_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    assert not shown("sglang.srt.server") and not shown("torch.nn.modules") and not shown("gyrescope")
    assert shown("gyre.real.store.tito_log") and shown("gyre")


def test_the_environment_gains_only_what_is_unset(monkeypatch):
    for name in QUIET_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MC_LOG_LEVEL", "INFO")  # someone wants Mooncake's lines
    with warnings.catch_warnings():
        quiet_third_parties()
    assert os.environ["MC_LOG_LEVEL"] == "INFO"
    assert all(os.environ[k] == v for k, v in QUIET_ENVIRONMENT.items() if k != "MC_LOG_LEVEL")
    assert logging.getLogger("sglang").level == logging.ERROR


def test_verbose_changes_nothing(monkeypatch):
    for name in QUIET_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    logging.getLogger("transformers").setLevel(logging.NOTSET)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_parties(verbose=True)
        warnings.warn_explicit("careful", UserWarning, "x.py", 1, module="torch.nn")
    assert caught and not any(k in os.environ for k in QUIET_ENVIRONMENT)
    assert logging.getLogger("transformers").level == logging.NOTSET


def test_gyre_run_takes_verbose():
    from gyre.cli import build_parser

    args = build_parser().parse_args(["run", "--config", "x.toml", "--verbose"])
    assert args.verbose is True
    assert build_parser().parse_args(["run", "--config", "x.toml"]).verbose is False
