"""A job judged as a whole (issue 41): what the other nodes said, decided (decide/world.py).

Pure: reports in, a verdict out.  The real two-node case, with torchrun's c10d store, is
tests/multinode/test_remote_wait.py; the helper against a real TCPStore is below."""

from __future__ import annotations

import sys

import pytest

from dflashd.supervisor.host.rdzvstore import share_and_hear
from dflashd.supervisor.model.world import (
    FRESH_S,
    WAITING,
    WORKING,
    NodeReport,
    WorldHeard,
    heard_from,
    share_of,
    share_request,
    someone_works,
    world_decides,
    world_stuck,
    world_summary,
)
from dflashd.trainer.storepeer import store_address


def waiting(node: int, waited: float = 70.0, age: float = 5.0) -> NodeReport:
    return NodeReport(node, WAITING, waited, "rank(s) [1] wait in recv", age)


@pytest.mark.parametrize(
    ("reports", "own_waited", "stuck"),
    [
        ((waiting(0), waiting(1)), 65.0, True),  # every node waited 60 s or more
        ((waiting(0), waiting(1)), 30.0, False),  # this node not long enough yet
        ((waiting(0), waiting(1, waited=40.0, age=5.0)), 65.0, False),  # node 1: 45 s so far
        ((waiting(0), waiting(1, waited=40.0, age=25.0)), 65.0, True),  # it wrote 25 s ago
        ((waiting(0),), 65.0, False),  # node 1 said nothing: it steps, or has no dflashd
        ((waiting(0), waiting(1, age=FRESH_S + 1)), 65.0, False),  # a stale report
        ((waiting(0), NodeReport(1, WORKING, 0.0, "pid 9 runs evaluate", 3.0)), 65.0, False),
    ],
)
def test_the_world_is_stuck_only_when_every_node_waited_long_enough(
    reports: tuple[NodeReport, ...], own_waited: float, stuck: bool
) -> None:
    heard = WorldHeard(2, reports)
    found = world_stuck(heard, 0, own_waited, 60.0)
    assert (found is not None) is stuck
    if stuck:
        assert found is not None and "recv" in found


def test_no_store_no_place_or_one_node_decides_nothing() -> None:
    assert world_stuck(None, 0, 1e6, 60.0) is None
    assert world_stuck(WorldHeard(2, error="refused"), 0, 1e6, 60.0) is None
    assert world_stuck(WorldHeard(2, (waiting(0), waiting(1))), None, 1e6, 60.0) is None
    assert world_stuck(WorldHeard(1, (waiting(0),)), 0, 1e6, 60.0) is None


def test_the_waiting_alert_is_left_to_the_store_when_it_can_decide() -> None:
    working = NodeReport(1, WORKING, 0.0, "pid 9 runs evaluate", 3.0)
    assert someone_works(WorldHeard(2, (waiting(0), working)))
    assert not someone_works(WorldHeard(2, (waiting(0), waiting(1))))
    assert world_decides(WorldHeard(2, (waiting(0), waiting(1))))
    assert not world_decides(WorldHeard(2, (waiting(0),)))  # node 1 silent: alert after all
    assert not world_decides(WorldHeard(2, error="refused"))
    summary = world_summary(WorldHeard(2, (waiting(0), working)))
    assert summary == "2 of 2 nodes reported: node 0 waiting 75s, node 1 working"


def test_share_needs_a_store_and_a_place_in_the_world() -> None:
    assert share_of(None, "job", 0, 2, None) is None
    assert share_of("h:1", "job", None, 2, None) is None
    assert share_of("h:1", "job", 0, 1, None) is None
    share = share_of("h:1", "job", 1, 2, (WAITING, 12.5, "recv"))
    assert share is not None and share.key_space == "dflashd/job" and share.state == WAITING


@pytest.mark.parametrize(
    ("endpoint", "address"),
    [
        ("10.0.0.1:29500", ("10.0.0.1", 29500)),
        ("node-a", ("node-a", 29400)),
        ("[::1]:1234", ("::1", 1234)),
        ("::1", ("::1", 29400)),
        ("host:notaport", None),
        ("", None),
    ],
)
def test_store_addresses(endpoint: str, address: tuple[str, int] | None) -> None:
    assert store_address(endpoint) == address


@pytest.mark.trainer
def test_the_helper_shares_and_hears_through_a_real_tcpstore() -> None:
    """Two nodes' helpers against one real c10d TCPStore (the daemon never imports torch:
    the helper runs as a script under the given Python)."""
    torch_distributed = pytest.importorskip("torch.distributed")
    from datetime import timedelta

    store = torch_distributed.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    endpoint = f"127.0.0.1:{store.port}"
    a = share_of(endpoint, "t", 0, 2, (WAITING, 70.0, "recv"))
    b = share_of(endpoint, "t", 1, 2, (WAITING, 61.0, "recv"))
    assert a is not None and b is not None
    heard_a = heard_from(share_and_hear(share_request(a), sys.executable), 2)
    assert heard_a.error is None and [r.node for r in heard_a.reports] == [0]
    heard_b = heard_from(share_and_hear(share_request(b), sys.executable), 2)
    assert [r.node for r in heard_b.reports] == [0, 1]
    assert world_stuck(heard_b, 1, 61.0, 60.0) is not None
    # nothing listens there: an error in words, never an exception or a hang past the bound
    gone = share_of("127.0.0.1:1", "t", 0, 2, None)
    assert gone is not None
    unreachable = heard_from(share_and_hear(share_request(gone), sys.executable), 2)
    assert unreachable.error is not None and world_stuck(unreachable, 0, 1e6, 60.0) is None
