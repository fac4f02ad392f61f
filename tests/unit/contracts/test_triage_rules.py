"""tfyarn.contracts.triage's rules for TF's distributed-runtime errors (issue 40), one test per rule, with TF 2.21's
own words (its libtensorflow_framework.so strings and messages seen on the test cluster): a peer's or the
transport's error is the cluster's fault (free of the user's budgets), the same class raised with no peer involved
stays the user's, and every decision says which rule made it."""

from __future__ import annotations

import pytest

from tfyarn.contracts.triage import (
    INFRA,
    USER,
    AttemptBudget,
    attempt_cause,
    classify,
    should_retry,
    tf_failure_text,
)

#: the message of issue 40 (a worker's step on the test cluster at load 30-47), exactly
RUNGRAPH_TWICE = (
    "AbortedError: Graph execution error: From /job:ps/replica:0/task:0: "
    "The same RunGraph (Worker) request was received twice."
)


def _decide(failure: str, task: str = "worker:1"):
    return classify(exit_code=1, failure=failure, task=task)


def test_rule_duplicate_rungraph_is_the_transport_and_free():
    t = _decide(RUNGRAPH_TWICE)
    assert (t.cls, t.cause, t.free) == (INFRA, "transport", True)
    assert "received twice" in t.rule and "retried a call" in t.rule
    # as the exit report's diagnosis reads it: retried, not "the job's own code failed"
    d = should_retry(f"worker:1: exit code 1: {RUNGRAPH_TWICE}")
    assert d.retry and d.cause is not None and d.cause.cause == "transport", d.reason
    budget = AttemptBudget(max_attempts=1)
    assert budget.next(f"worker:1: exit code 1: {RUNGRAPH_TWICE}") and budget.free == 1 and budget.counted == 1


@pytest.mark.parametrize(
    "failure",
    [
        'AbortedError: From /job:ps/replica:0/task:0: Session handle is not found: 8b5d1c4e0a2f. Possibly this '
        'worker ("/job:ps/replica:0/task:0") just restarted.',
        "AbortedError: Session 5b9d0e7a4c31 is not found. Possibly, this master has restarted.",
        "AbortedError: Graph execution error: From /job:ps/replica:0/task:1: Graph handle is not found: "
        "0000000000000001. Possibly, this worker just restarted.",
    ],
)
def test_rule_a_restarted_peer_forgot_the_session(failure):
    t = _decide(failure)
    assert (t.cls, t.cause, t.free) == (INFRA, "peer_restarted", True)
    assert "restarted peer no longer knows" in t.rule


@pytest.mark.parametrize(
    "failure,said",
    [
        ("UnavailableError: Socket closed", "Socket closed"),
        (
            "UnavailableError: Graph execution error: From /job:ps/replica:0/task:0: Connection reset by peer "
            "Additional GRPC error information from remote target /job:ps/replica:0/task:0",
            "Connection reset",
        ),
        (
            "UnavailableError: failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:36217: "
            "Failed to connect to remote host: Connection refused",
            "failed to connect to all addresses",
        ),
        ("CancelledError: [_Derived_]RecvAsync is cancelled. [[{{node Recv_3}}]]", "RecvAsync is cancelled"),
        ("CancelledError: RecvFromRemoteAsync is cancelled", "RecvFromRemoteAsync is cancelled"),
        ("UnavailableError: Stream removed", "Stream removed"),
    ],
)
def test_rule_grpc_transport_words(failure, said):
    t = _decide(failure)
    assert (t.cls, t.cause, t.free) == (INFRA, "transport", True)
    assert said in t.rule and "gRPC transport failed" in t.rule


@pytest.mark.parametrize("kind", ["UnavailableError", "AbortedError", "DeadlineExceededError", "CancelledError"])
def test_rule_the_error_came_from_another_task(kind):
    failure = f"{kind}: Graph execution error: From /job:ps/replica:0/task:0: FIFOQueue 'q' is closed."
    t = _decide(failure, task="worker:1")
    assert (t.cls, t.cause, t.free) == (INFRA, "peer_lost", True)
    assert 'came "From /job:ps/replica:0/task:0", another task than worker:1' in t.rule
    # the same words from this task's own partition: TF prefixes its own partition's errors with From too
    own = f"{kind}: Graph execution error: From /job:worker/replica:0/task:1: FIFOQueue 'q' is closed."
    u = _decide(own, task="worker:1")
    # (a deadline of its own is a step past timeouts.step: the cluster's, but counted)
    mine = (INFRA, "timeout") if kind == "DeadlineExceededError" else (USER, "exception")
    assert (u.cls, u.cause, u.free) == (*mine, False)
    # ...and from the other worker it is a peer again
    assert _decide(own, task="worker:0").cause == "peer_lost"


def test_rule_the_failing_op_ran_on_another_task():
    peer = "AbortedError: Graph execution error: the op gave up (TF op read_w on /job:ps/task:0/device:CPU:0)"
    t = _decide(peer)
    assert (t.cls, t.cause) == (INFRA, "peer_lost") and "placed on ps:0" in t.rule
    own = "AbortedError: Graph execution error: the op gave up (TF op read_w on /job:worker/task:1/device:CPU:0)"
    assert _decide(own).cls == USER


def test_rule_unavailable_naming_another_task():
    t = _decide("UnavailableError: Task /job:chief/replica:0/task:0 heartbeat timeout: unavailable")
    assert (t.cls, t.cause) == (INFRA, "peer_lost") and "names another task (/job:chief/replica:0/task:0)" in t.rule
    # an Aborted error merely mentioning a task (no From, no op there) is not enough
    assert _decide("AbortedError: the model aborted on /job:chief/replica:0/task:0 data").cls == USER


def test_rule_the_users_own_aborted_error_stays_the_users():
    for failure in (
        "AbortedError: model gave up",  # tf.errors.AbortedError(None, None, "model gave up") in the model
        "tensorflow.python.framework.errors_impl.AbortedError: model gave up",
        "UnavailableError: my feature service is down",
    ):
        t = _decide(failure)
        assert (t.cls, t.cause, t.free) == (USER, "exception", False), failure
        assert "no peer or transport named" in t.rule
    d = should_retry("worker:1: exit code 1: AbortedError: model gave up")
    assert not d.retry and "the job's own code failed (raised AbortedError)" in d.reason


def test_rule_a_step_timeout_from_a_peer_is_free_and_ones_own_counts():
    peer = "timed out: DeadlineExceededError: Graph execution error: From /job:ps/replica:0/task:0: Timed out"
    t = classify(exit_code=4, failure=peer, task="worker:0")
    assert (t.cls, t.cause, t.free) == (INFRA, "peer_lost", True)
    own = classify(exit_code=4, failure="timed out: DeadlineExceededError: Deadline Exceeded", task="worker:0")
    assert (own.cls, own.cause, own.free) == (INFRA, "timeout", False)


def test_recent_logs_tf_appends_decide_nothing():
    # TF 2.21 appends the process's recent warnings to an error: an earlier peer's words must not decide
    own = (
        "CancelledError: Graph execution error: From /job:worker/replica:0/task:0: FIFOQueue 'q' is closed. "
        "Recent warning and error logs: W0000 local_rendezvous.cc:412] From /job:ps/replica:0/task:0: Socket closed"
    )
    assert _decide(own, task="worker:0").cls == USER


def test_failure_text_keeps_the_runtime_words_on_one_line_within_the_record():
    trace = "\n".join(f'  File "/env/lib/python3.11/site-packages/model_{i}.py", line {i}, in call' for i in range(80))
    message = (
        f"Graph execution error:\n\nDetected at node 'step/apply' defined at (most recent call last):\n{trace}\n"
        "Node: 'step/apply'\nFrom /job:ps/replica:0/task:0:\nThe same RunGraph (Worker) request was received twice."
        " step_id: 8876; graph_handle: \"0000\"\n\t [[{{node step/apply}}]]\n"
        "Recent warning and error logs:\n  W0000 grpc: Socket closed"
    )
    assert len(message) > 2000
    text = tf_failure_text("AbortedError", message, "step/apply", "/job:ps/replica:0/task:0/device:CPU:0")
    assert len(text) <= 2000 and "\n" not in text and "; " not in text and "Recent warning" not in text
    assert text.startswith("AbortedError: Graph execution error: From /job:ps/replica:0/task:0: The same RunGraph")
    assert text.endswith("(TF op step/apply on /job:ps/replica:0/task:0/device:CPU:0)")
    assert _decide(text).cause == "transport"
    # a diagnosis of two tasks: the worker's record stays one part
    cause = attempt_cause(f"worker:1: exit code 1: {text}; chief:0: exit code 1: UnavailableError: Socket closed")
    assert cause is not None and cause.cause == "transport"


def test_every_decision_names_its_rule():
    for kwargs in (
        {"exit_status": -102},
        {"exit_status": -104},
        {"exit_status": -100, "diagnostics": "Container released on a *lost* node"},
        {"diagnostics": "Container preempted by scheduler"},
        {"exit_code": 1, "failure": "HdfsUnavailable: HDFS unavailable: upload failed"},
        {"exit_code": 1, "failure": "ValueError: bad shape"},
        {"exit_code": 137},
        {"exit_code": 3},
        {},
    ):
        t = classify(**kwargs)
        assert t.rule and t.to_dict() == {"class": t.cls, "cause": t.cause, "words": t.words, "rule": t.rule}
