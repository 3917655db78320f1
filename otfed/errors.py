"""The exceptions otfed raises for bad input. Each names the thing that is wrong.

Stages catch :class:`OtfedError`, print its one-line message and exit with status 2, leaving no
half-written output behind.
"""


class OtfedError(Exception):
    """Base class: a user-facing error whose message names the offending file, key, client or column."""


class ConfigError(OtfedError, ValueError):
    """params.yaml is invalid: unknown key, wrong type or out-of-range value (message names the key path).

    ``keys`` are the dotted key paths at fault when the error comes from validating a params file (list
    items as ``key[i]``); empty otherwise.
    """

    def __init__(self, message: str, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys


class DataFileError(OtfedError):
    """A dataset file is missing, unreadable or lacks a required key/column (message names file and key)."""


class DataError(DataFileError):
    """A data file opens but breaks its declared format: a value out of range (a label ≥ the number of
    classes, a client index past the clients listed), arrays of different lengths, a wrong shape or dtype,
    NaN / inf where the format allows none. The message names the file, the field and what is allowed, e.g.
    ``data/partitions/pairs.npz: y of client 3 (client_03): label 99 outside 0..9``."""


class WorkspaceError(OtfedError):
    """A stage cannot write its outputs: an output folder (or the folder that holds it) is not writable, or
    the disk has too little free space. The message names the folder and what is needed."""


class DegenerateClientError(OtfedError):
    """A client's data cannot be used (empty, a class with too few samples, NaN/inf); names the client."""


class OTConvergenceError(OtfedError):
    """An exact OT solver stopped before reaching optimality (e.g. POT's numItermax was hit)."""


class SupportGrowthError(OtfedError):
    """Exact interpolating measures (FedWaD eq. 5) grew beyond the configured support cap."""
