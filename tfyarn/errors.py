"""Errors and the exit codes the CLI maps them to (stable: schedulers such as Airflow and Oozie branch on them)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    SUCCEEDED = 0
    FAILED = 1
    INVALID = 2  # bad spec or usage: nothing was started
    KILLED = 3
    TIMED_OUT = 4


#: What a timeout's message says (lower case). On YARN a task's exit code is not visible to the follower, only its
#: failure message: a FAILED application whose diagnostics or task failures contain it is TIMED_OUT (exit 4).
TIMEOUT_MARK = "timed out"


def timeout_message(message: str) -> str:
    """``message``, marked as a timeout (``timed out: …``) unless it already says so."""
    return message if TIMEOUT_MARK in message.lower() else f"{TIMEOUT_MARK}: {message}"


def without_timeout_mark(message: str) -> str:
    """``message`` without the ``timed out: `` prefix :func:`timeout_message` added: once the state says TIMED_OUT
    the diagnosis reads as the local backend's (``training stalled: …``)."""
    prefix = f"{TIMEOUT_MARK}: "
    return message[len(prefix) :] if message.lower().startswith(prefix) else message


class TfyarnError(Exception):
    """Base of every error tfyarn raises on purpose; ``exit_code`` is what the CLI exits with."""

    exit_code: int = ExitCode.FAILED


class SpecError(TfyarnError):
    """One or more problems in a job spec; all are listed, each with its YAML path."""

    exit_code = ExitCode.INVALID

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        n = len(self.problems)
        super().__init__(
            f"{n} problem{'s' if n != 1 else ''} in the job spec:\n" + "\n".join(f"  - {p}" for p in self.problems)
        )


class PreflightError(TfyarnError):
    """The cluster or the data cannot run this spec (checked before anything is uploaded).
    ``problems``: one line each when preflight's checks found several (else empty)."""

    exit_code = ExitCode.INVALID

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = list(problems or [])


class WaitTimeout(TfyarnError):
    """A bounded wait ran out; the message names what was waited for."""

    exit_code = ExitCode.TIMED_OUT


class AppNotFound(TfyarnError):
    exit_code = ExitCode.INVALID


class YarnUnavailable(TfyarnError):
    """No YARN cluster is reachable from here (no Hadoop configuration, or the skein driver cannot start): a usage
    problem on this machine, not a job failure, so exit 2 like a bad spec."""

    exit_code = ExitCode.INVALID


class ExportError(TfyarnError):
    """A SavedModel export could not start: no checkpoint to export, an unknown one, no TensorFlow here."""

    exit_code = ExitCode.INVALID
