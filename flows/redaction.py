"""Credentials never reach a console line, a log file, ``otfed doctor``, or what Prefect stores of a run.

What :func:`redact` hides, in a URI of any scheme: the password of ``user:password@`` (``user:***@``); a user
name alone, which is how tokens travel (``https://TOKEN@host`` → ``https://***@host``); a query or fragment value
whose name is a credential word or ends with one (``?token=``, ``&password=``, ``&api_key=``, ``&client_secret=``,
``&X-Amz-Signature=``, ``#access_token=`` …). ``MLFLOW_TRACKING_URI``, a ``PREFECT_API_URL`` or a Dask address
with credentials are shown so.

Where: every ``error:`` line a stage prints and every line it announces, its log file (:class:`RedactingFormatter`:
messages, tracebacks and exception texts alike, whatever library wrote them), each ``otfed doctor`` line, and
what reaches Prefect. Prefect writes a failed run's exception into its database (the state message, the API logs,
the events the UI shows) and its result storage, so an exception whose text holds a credential leaves a Prefect
flow or task as a :class:`CredentialsHidden` stand-in that carries only the redacted text
(:func:`exceptions_hidden`); the original stays in the process (:func:`unhidden`) for the console's error line
and the exit status. Every record a Prefect log handler sends goes through :class:`RedactingFilter`
(:func:`hide_in_prefect_logs`). The environment itself is left as it is: the libraries that connect need the
secret.
"""
from __future__ import annotations

import copyreg
import logging
import re
import traceback
from contextlib import contextmanager
from typing import Any, Iterator

HIDDEN = "***"
# scheme://userinfo@ — the userinfo runs to the authority's last '@' (a password may hold one): no '/', '?', '#',
# space. ``user:password`` keeps the user name; a user name alone is a token
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#]+)@")
# ?token= &password= &api_key= &client_secret= #access_token= …: a value whose name ends in a credential word
_QUERY = re.compile(r"(?P<head>[?&#;][A-Za-z0-9_.-]*?(?:token|passw(?:or)?d|pwd|secret|key|sig|signature|auth"
                    r"|credentials?)=)(?P<secret>[^&\s]+)", re.IGNORECASE)


def _userinfo_hidden(match: re.Match[str]) -> str:
    user, colon, _ = match["userinfo"].partition(":")
    return f"{match['scheme']}{user}:{HIDDEN}@" if colon else f"{match['scheme']}{HIDDEN}@"


def redact(text: str) -> str:
    """``text`` with every credential of a URI replaced by ``***``: the password of ``scheme://user:password@``,
    the user name of ``scheme://TOKEN@`` and every credential query value (module docstring)."""
    text = _USERINFO.sub(_userinfo_hidden, text)
    return _QUERY.sub(lambda m: f"{m['head']}{HIDDEN}", text)


class RedactingFormatter(logging.Formatter):
    """A :class:`logging.Formatter` whose every formatted record (message, traceback) goes through
    :func:`redact`."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class RedactingFilter(logging.Filter):
    """Rewrites a record in place, before its handler formats it, whatever formatter that handler has: the
    message (arguments merged in), the traceback and the stack with credentials hidden. Lets every record
    through."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit the message: the handler reports it, sending nothing
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def hide_in_prefect_logs() -> None:
    """Put a :class:`RedactingFilter` on every log handler Prefect configured (the API handler whose records the
    Prefect database keeps, its console handler), once each. Call after importing prefect."""
    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in logging.root.manager.loggerDict]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if type(handler).__module__.startswith("prefect.") \
                    and not any(isinstance(f, RedactingFilter) for f in handler.filters):
                handler.addFilter(RedactingFilter())


class CredentialsHidden(Exception):
    """Stands in for an exception whose text held a credential, wherever Prefect would store it: the message is
    ``<type>: <message>`` and the notes are the original's, credentials hidden. :attr:`original` is the
    exception itself in this process only: it is never pickled, so it never reaches a result store or another
    process."""

    def __init__(self, message: str, original: BaseException | None = None) -> None:
        super().__init__(message)
        self.original = original

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), self.args, {"__notes__": list(getattr(self, "__notes__", []))}


def _pickled_without_original() -> None:
    """Make every pickler use :meth:`CredentialsHidden.__reduce__`: ``copyreg``'s table outranks a class's own
    ``__reduce__``, and ``distributed`` fills it with tblib's exception reducer (``tblib.pickling_support.install``),
    which pickles an exception's ``__context__`` — the original — and its traceback."""
    copyreg.pickle(CredentialsHidden, CredentialsHidden.__reduce__)


def hidden(exc: BaseException) -> BaseException:
    """``exc`` itself when nothing in its text (message, notes, the exceptions it was raised from) is a
    credential; else a :class:`CredentialsHidden` stand-in holding the redacted text."""
    text = "".join(traceback.format_exception(exc))
    if redact(text) == text:
        return exc
    stand_in = CredentialsHidden(redact(f"{type(exc).__name__}: {exc}"), exc)
    for note in getattr(exc, "__notes__", []):
        stand_in.add_note(redact(note))
    return stand_in


def unhidden(exc: BaseException) -> BaseException:
    """The exception a :class:`CredentialsHidden` stands in for when this process raised it, else ``exc``."""
    return exc.original if isinstance(exc, CredentialsHidden) and exc.original is not None else exc


@contextmanager
def exceptions_hidden() -> Iterator[None]:
    """An exception leaving the block is re-raised as its :func:`hidden` stand-in when its text holds a
    credential, with the original out of its chain (so no traceback shows it): wrap a Prefect flow's or task's
    body in it, and what Prefect stores of a failure never holds the credential."""
    try:
        yield
    except Exception as exc:
        stand_in = hidden(exc)
        if stand_in is exc:
            raise
        _pickled_without_original()  # now: tblib may have been installed since this module was imported
        raise stand_in from None
