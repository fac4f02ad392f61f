"""The port a task publishes at rendezvous: free on every interface TF's server binds, and out of the ephemeral range
that outgoing connections draw from while the task imports TensorFlow (the port is only bound by TF then)."""
import socket

from tfyarn.task import rendezvous
from tfyarn.task.rendezvous import PORT_FLOOR, reserve_port


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def test_the_port_is_below_the_ephemeral_range_and_free_on_every_interface():
    low = rendezvous._ephemeral_low()
    ports = {reserve_port() for _ in range(20)}
    assert all(PORT_FLOOR <= p < low for p in ports), (sorted(ports), low)
    assert len(ports) > 10                                          # drawn at random, not one fixed port
    assert all(_bindable(p) for p in ports)


def test_a_port_taken_on_another_local_address_is_skipped(monkeypatch):
    """A second NodeManager's containers use 127.0.0.2: a port listened on there is taken for TF's 0.0.0.0 bind,
    though 127.0.0.1 alone (what was checked for a 'localhost' task) has it free."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held, \
            socket.socket(socket.AF_INET, socket.SOCK_STREAM) as spare:
        held.bind(("127.0.0.2", 0))
        held.listen()
        taken = held.getsockname()[1]
        spare.bind(("0.0.0.0", 0))
        free = spare.getsockname()[1]
        spare.close()
        tries = iter([taken, free])
        monkeypatch.setattr(rendezvous.random.SystemRandom, "randint", lambda self, a, b: next(tries))
        monkeypatch.setattr(rendezvous, "_ephemeral_low", lambda: 65000)
        assert reserve_port() == free


def test_without_room_below_the_ephemeral_range_any_free_port(monkeypatch):
    monkeypatch.setattr(rendezvous, "_ephemeral_low", lambda: PORT_FLOOR + 10)
    assert _bindable(reserve_port())
