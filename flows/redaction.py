"""Credentials never reach a console line, a log file or ``otfed doctor``: ``user:password@`` in a URI
(``MLFLOW_TRACKING_URI=https://alice:secret@mlflow.example``, a ``PREFECT_API_URL`` or a Dask address with
credentials) is written ``user:***@``; a ``?token=`` / ``&password=`` query value likewise.

:func:`redact` is applied to every ``error:`` line a stage prints, to the stage's log file (the formatter of
its handler: messages, tracebacks and exception texts alike, whatever library wrote them) and to each
``otfed doctor`` line. The environment itself is left as it is: the libraries that connect need the secret.
"""
from __future__ import annotations

import logging
import re

HIDDEN = "***"
# scheme://user:password@  (the password: anything up to the '@' that ends the authority, no '/', no space)
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*):(?P<secret>[^\s/@]+)@")
# ?token=… &password=… &api_key=… (query values that are credentials)
_QUERY = re.compile(r"(?P<head>[?&](?:token|password|passwd|secret|api[_-]?key|access[_-]?token)=)(?P<secret>[^&\s]+)",
                    re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` URI and every credential query value
    replaced by ``***``."""
    text = _USERINFO.sub(lambda m: f"{m['head']}:{HIDDEN}@", text)
    return _QUERY.sub(lambda m: f"{m['head']}{HIDDEN}", text)


class RedactingFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose every formatted record (message, traceback) goes through
    :func:`redact`."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))
