"""The one exception the data layer raises on purpose.

Its structured fields say *where* bad input is (file, byte offset, record index, feature), so a user finds the record
with a hex dump instead of re-running the job; the feeder's ``skip`` mode reports them.
"""

from __future__ import annotations

from tfyarn.errors import ExitCode, TfyarnError


class DataError(TfyarnError):
    """Bad or missing input data. ``str(err)`` is the full, human-readable message."""

    exit_code = ExitCode.FAILED

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        record: int | None = None,
        feature: str | None = None,
    ):
        super().__init__(message)
        self.path, self.offset, self.record, self.feature = path, offset, record, feature

    def __reduce__(self):
        """Pickle with the structured fields (errors cross from the framing process, ``tfyarn.data.framer``)."""
        return type(self), (str(self),), self.__dict__


class NoDataError(DataError):
    """Nothing to read (a glob matched no file, or every file is empty): nothing was started, so INVALID."""

    exit_code = ExitCode.INVALID
