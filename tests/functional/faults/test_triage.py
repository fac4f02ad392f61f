"""tfyarn.contracts.triage: each way a task ends badly, with the texts YARN, skein, hdfs-native and
tfyarn's runtime really write (issue 30's runs on Hadoop 3.3.6), in its class; the restart policy
read the same on both backends."""

from __future__ import annotations

import pytest

from tfyarn.contracts.triage import INFRA, USER, classify, describe, restarts

CASES = [
    # (kwargs, class, cause, free of the budgets)
    (
        {"exit_status": -102, "diagnostics": "Container preempted by scheduler"},
        INFRA,
        "preempted",
        True,
    ),
    (
        {"exit_status": -106, "diagnostics": "Container preempted by scheduler"},
        INFRA,
        "preempted",
        True,
    ),
    (
        {"exit_status": -106, "diagnostics": "Container killed on request. Exit code is 143"},
        INFRA,
        "preempted",
        True,
    ),
    (
        {"diagnostics": "Container preempted by scheduler"},
        INFRA,
        "preempted",
        True,
    ),  # skein's text alone
    (
        {"exit_status": -100, "diagnostics": "Container released on a *lost* node"},
        INFRA,
        "node_lost",
        True,
    ),
    (
        {
            "exit_status": -104,
            "diagnostics": "is running 2.1 GB beyond the 'PHYSICAL' memory limit",
        },
        INFRA,
        "memory",
        False,
    ),
    (
        {
            "diagnostics": "Container [pid=1] is running beyond physical memory limits. Current "
                           "usage: 2.1 GB"
        },
        INFRA,
        "memory",
        False,
    ),
    (
        {
            "exit_code": 1,
            "failure": 'RuntimeError: DataTransferError("All DataNodes failed: [DatanodeInfoProto '
                       '{',
        },
        INFRA,
        "hdfs",
        False,
    ),
    (
        {
            "exit_code": 1,
            "failure": "HdfsUnavailable: HDFS unavailable: checkpoint upload to hdfs://nn/c failed "
                       "for 120s"
            ": OperationFailed: Failed to complete file in time",
        },
        INFRA,
        "hdfs",
        False,
    ),
    (
        {
            "exit_code": 1,
            "failure": "RuntimeError: token (HDFS_DELEGATION_TOKEN token 7 for alice) is expired",
        },
        INFRA,
        "token",
        False,
    ),
    (
        {"exit_code": 1, "failure": "CancelledError: RecvFromRemoteAsync is cancelled"},
        INFRA,
        "transport",
        True,
    ),
    ({"exit_code": 1, "failure": "UnavailableError: Socket closed"}, INFRA, "transport", True),
    (
        {
            "exit_code": 1,
            "failure": "RuntimeError: worker:0: step 40 failed because a peer is unreachable or stopped "
                       "heartbeating (frozen or dead); peers named by TF: chief:0. TF said: UnavailableError: x",
        },
        INFRA,
        "peer_lost",
        True,
    ),  # allreduce's words for a peer gone (the chief preempted): not the user's code
    (
        {
            "exit_code": 1,
            "failure": "NonFiniteLoss: worker:0: loss is nan at step 7 (global step 9, epoch 0; "
                       "last finite"
            " loss 0.69): training diverged.",
        },
        USER,
        "nan_loss",
        False,
    ),
    (
        {
            "exit_code": 1,
            "failure": "DataError: hdfs://nn/d/part-3: not a TFRecord file (no valid record header "
                       "at "
            "byte 0)",
        },
        USER,
        "bad_input",
        False,
    ),
    ({"exit_code": 1, "failure": "ZeroDivisionError: division by zero"}, USER, "exception", False),
    ({"exit_code": 3}, USER, "exit", False),
    (
        {
            "diagnostics": "Application application_1_0009 failed 1 times (global limit =2; local limit is =1) "
                           "due to AM Container for appattempt_1_0009_000001 exited with  exitCode: 137"
        },
        INFRA,
        "am_lost",
        False,
    ),
    ({"exit_code": 1, "failure": "KVUnavailable: the job's KV at 10.0.0.5:4242 does not answer"}, INFRA, "io",
     False),
    ({"exit_code": 1, "failure": "OSError: [Errno 28] No space left on device: '/data/ckpt'"}, INFRA, "io", False),
    ({"exit_code": 137}, INFRA, "signal", False),
    ({"exit_code": -9}, INFRA, "signal", False),
]


@pytest.mark.parametrize(
    "kwargs,cls,cause,free", CASES, ids=[c[2] + str(i) for i, c in enumerate(CASES)]
)
def test_each_way_a_task_ends_is_classified(kwargs, cls, cause, free):
    t = classify(**kwargs)
    assert (t.cls, t.cause, t.free) == (cls, cause, free), kwargs
    assert t.infrastructure == (cls == INFRA) and t.words


def test_yarn_word_wins_over_the_task_text_and_words_read_as_a_sentence():
    # a preempted worker's Python saw only its peers go away: YARN's status says what happened
    t = classify(
        exit_status=-102, exit_code=143, failure="CancelledError: RecvFromRemoteAsync is cancelled"
    )
    assert t.cause == "preempted"
    assert (
        describe("worker:1", t, step=5688, detail="queue a over its share")
        == "worker:1 preempted by the scheduler at step 5,688 (queue a over its share)"
    )
    assert (
        describe("chief:0", classify(failure="ValueError: bad shape"))
        == "chief:0 raised ValueError"
    )


def test_restart_policy_is_read_the_same_on_both_backends():
    assert not restarts("never", 137)
    assert restarts("on_failure", 1) and restarts("on_failure", 137)
    # exit_code (Kubeflow's ExitCode): the code's own exit is permanent, a kill from outside is not
    assert not restarts("exit_code", 1) and not restarts("exit_code", 127)
    assert restarts("exit_code", 137) and restarts("exit_code", 143) and restarts("exit_code", -9)
    assert restarts("exit_code", None)  # YARN took the container: no code at all
    # with the triage: an infrastructure fault that surfaced as an exit 1 (HDFS down) is retried,
    # user code is not
    assert restarts(
        "exit_code", 1, classify(exit_code=1, failure="HdfsUnavailable: HDFS unavailable: read x")
    )
    assert not restarts("exit_code", 1, classify(exit_code=1, failure="KeyError: 'label'"))


def test_attempts_the_cluster_ended_do_not_use_up_max_attempts():
    from tfyarn.contracts.triage import FREE_ATTEMPTS, AttemptBudget, attempt_cause

    pre = (
        "worker:1 preempted by the scheduler at step 405; chief:0: exit code 1: CancelledError: "
        "RecvFromRemoteAsync"
        " is cancelled"
    )
    assert attempt_cause(pre).cause == "preempted" and attempt_cause("").__class__ is type(None)
    mixed = "worker:1: preempted by the scheduler; chief:0: exit code 1: ValueError: bad shape"
    assert attempt_cause(mixed).cls == USER  # the user's code failed too: it counts
    sync = ("worker:1: preempted by the scheduler\nFailure in service worker, see logs for more "
            "information")
    assert attempt_cause(sync).free  # skein's own words say nothing of a cause
    assert attempt_cause("Failure in service worker, see logs for more information") is None
    b = AttemptBudget(max_attempts=2)
    assert b.next(pre) and b.next(pre) and (b.counted, b.free) == (1, 2)
    assert b.note() == "2 attempts ended by the cluster (not counted in retry.max_attempts)"
    assert b.next("ps:0: exit code 137 (killed by SIGKILL)") and (b.counted, b.free) == (2, 2)
    assert not b.next(
        "chief:0: exit code 1: ValueError: x"
    )  # max_attempts used up by the job's own failures
    assert b.next(pre)  # ...but the cluster's still get their own budget
    b.free = FREE_ATTEMPTS
    assert not b.next(pre)  # the separate bound: no endless loop


def test_the_user_code_is_not_retried_the_cluster_is():
    from tfyarn.contracts.triage import AttemptBudget, should_retry

    user = should_retry("chief:0 exited with code 1: ValueError: bad shape")   # the local launcher's words
    assert not user and user.cause.cause == "exception" and "not retried" in user.reason
    assert not should_retry("chief:0: exit code 1: NonFiniteLoss: chief:0: loss is nan at step 7")
    assert not should_retry("worker:0: exit code 1: DataError: hdfs://nn/d/part-3: not a TFRecord file")
    # killed from outside, whatever it printed last: retried
    assert should_retry("chief:0 exited with code -9: INFO:tensorflow:global_step/sec: 12")
    assert should_retry("chief:0: exit code 137 (killed by SIGKILL)")
    assert should_retry("worker:1: preempted by the scheduler")
    # a step past timeouts.step (exit 4) once its chief was stopped (seen on YARN): its peers, not its code
    timed = should_retry("worker:0: exit code 4: DeadlineExceededError: Graph execution error:\n\nOperation timed out.")
    assert timed and timed.cause.cause == "timeout" and not timed.cause.free, timed
    assert should_retry("")                                          # unknown: retried, within the budget
    assert should_retry("chief:0 exited with code 1: ValueError: x", state="TIMED_OUT")
    b = AttemptBudget(max_attempts=3)
    assert not b.next("chief:0: exit code 1: ValueError: x") and b.counted == 1
    assert b.refused is not None and b.refused.cause.words == "raised ValueError"
