"""What the daemons (dqoesd, dqoes-agent, dqoes-manager) do alike as they start: their
command line's --version and -v, their logging (stderr, for journald), where a hung one was
(a watchdog's SIGABRT), and SIGTERM/SIGINT ending their loop."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import threading

from . import __version__
from .logs import setup_logging


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default unless it has none or its text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or "default" in text or action.default is False:
            return text
        return super()._get_help_string(action)


def parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A daemon's command line: described by the first paragraph of its `doc`, with
    --version and -v/--verbose."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0],
                                formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"{prog} {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages too")
    return p


def start(verbose: bool, log: logging.Logger) -> threading.Event:
    """Logging set up; the event that SIGTERM and SIGINT set (the first one logged)."""
    setup_logging(verbose)
    faulthandler.enable()  # a hung loop killed by the watchdog (SIGABRT) logs where it hung
    stopping = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        if not stopping.is_set():
            log.info("%s: stopping", signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return stopping
