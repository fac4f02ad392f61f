"""The one exception the data layer raises on purpose.

Why a dedicated type with structured fields: a training job that dies on bad input must say *where* (file, byte
offset, record index, feature) so the user can find the record with a hex dump instead of re-running the job. The
fields are also what tests assert on, and what the feeder's ``skip`` mode reports.
"""
from __future__ import annotations

from tfyarn.errors import ExitCode, TfyarnError


class DataError(TfyarnError):
    """Bad or missing input data. ``str(err)`` is the full, human-readable message."""
    exit_code = ExitCode.FAILED

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None,
                 record: int | None = None, feature: str | None = None):
        super().__init__(message)
        self.path, self.offset, self.record, self.feature = path, offset, record, feature

    def __reduce__(self):
        """Pickle with the structured fields (errors cross from the framing process, ``tfyarn.data.framer``)."""
        return _rebuild, (type(self), str(self), self.path, self.offset, self.record, self.feature)


def _rebuild(cls, message, path, offset, record, feature):
    return cls(message, path=path, offset=offset, record=record, feature=feature)


class NoDataError(DataError):
    """Nothing to read (a glob matched no file, or every file is empty): nothing was started, so INVALID."""
    exit_code = ExitCode.INVALID
