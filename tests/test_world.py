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


W = "10.0.0.1:29500/job"  # this round's world (model/world.py's world_of)


def _item(**over: object) -> dict[str, object]:
    item: dict[str, object] = {
        "node": 1,
        "state": WAITING,
        "waited_s": 70.0,
        "why": "recv",
        "age_s": 5.0,
        "world": W,
    }
    return {**item, **over}


@pytest.mark.parametrize(
    ("item", "kept"),
    [
        (_item(), True),
        (_item(world="10.0.0.1:29511/job"), False),  # an earlier restart round (a new port)
        (_item(world="10.0.0.9:29500/other"), False),  # another job sharing the store and id
        (_item(world=None), False),  # a report with no round: not this one's
        (_item(age_s=-3600.0), False),  # dated an hour ahead: fresh for ever otherwise
        (_item(age_s=-2.0), True),  # a clock two seconds ahead: read as fresh now
        (_item(waited_s=float("inf")), False),
        (_item(waited_s=float("nan")), False),
        (_item(age_s=float("nan")), False),
        (_item(waited_s=-5.0), False),
        (_item(waited_s=1e12), False),
        (_item(node=7), False),  # no such node in a world of 2
        (_item(node=True), False),
        (_item(node="1"), False),
        (_item(state="hung"), False),
        (_item(why=["x"]), False),
        ("a string", False),
        (["a", "list"], False),
        (None, False),
    ],
    ids=[
        "this round",
        "earlier round",
        "another job",
        "no round",
        "from the future",
        "small skew",
        "inf wait",
        "nan wait",
        "nan age",
        "negative wait",
        "absurd wait",
        "no such node",
        "bool node",
        "text node",
        "unknown state",
        "odd why",
        "string",
        "list",
        "null",
    ],
)
def test_a_store_value_is_evidence_only_when_it_is_this_worlds(item: object, kept: bool) -> None:
    heard = heard_from({"reports": [item]}, 2, W)
    assert (len(heard.reports), heard.left_out) == ((1, 0) if kept else (0, 1))
    if kept:
        assert heard.reports[0].age_s >= 0.0


def test_stale_future_and_foreign_keys_never_end_a_healthy_rank_nor_hide_a_stuck_world() -> None:
    """Node 1's only report is another round's (or dated ahead): the world is not stuck, since
    node 1 said nothing of this round.  Beside a junk value, every node's own report of this
    round still finds a truly stuck world."""
    here = _item(node=0)
    for stale in (_item(world="10.0.0.1:29511/job"), _item(age_s=-3600.0)):
        heard = heard_from({"reports": [here, stale]}, 2, W)
        assert world_stuck(heard, 0, 1e5, 60.0) is None
    junk = {"reports": [here, _item(), {"node": 1, "state": "waiting"}], "skipped": 3}
    heard = heard_from(junk, 2, W)
    assert heard.left_out == 4 and world_stuck(heard, 0, 70.0, 60.0) is not None


@pytest.mark.trainer
def test_the_helper_reads_every_node_past_malformed_and_oversized_values() -> None:
    """A real TCPStore holding, in dflashd's keys, a value that is not JSON, one that is not
    an object, one of 1 MiB and one dated in the future beside node 0's real report: the
    helper answers (never fails on one value), the daemon keeps node 0's report only."""
    torch_distributed = pytest.importorskip("torch.distributed")
    from datetime import timedelta

    store = torch_distributed.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10)
    )
    endpoint = f"127.0.0.1:{store.port}"
    store.set("dflashd/t/node/1", "not json {")
    store.set("dflashd/t/node/2", "[1, 2]")
    store.set("dflashd/t/node/3", "x" * (1 << 20))
    future = (
        '{"node": 4, "state": "waiting", "waited_s": 90, "why": "x", "world": "%s", "at": 1e12}'
    )
    store.set("dflashd/t/node/4", future % W)
    share = share_of(endpoint, "t", 0, 5, (WAITING, 70.0, "recv"), W)
    assert share is not None
    heard = heard_from(share_and_hear(share_request(share), sys.executable), 5, W)
    assert heard.error is None, heard
    assert [r.node for r in heard.reports] == [0] and heard.left_out == 4
    assert world_stuck(heard, 0, 1e5, 60.0) is None


@pytest.mark.trainer
def test_a_frozen_store_host_is_an_error_in_bounded_time_never_a_dead_world() -> None:
    """The store's host frozen with SIGSTOP: the helper's answer is an error within its bound,
    and an error never ends a rank (no world is stuck on a store that cannot be read)."""
    import signal
    import subprocess
    import time

    pytest.importorskip("torch.distributed")
    code = (
        "import sys, time\nfrom datetime import timedelta\n"
        "from torch.distributed import TCPStore\n"
        "s = TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False,"
        " timeout=timedelta(seconds=30))\nprint(s.port, flush=True)\ntime.sleep(600)\n"
    )
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        port = int(host.stdout.readline())
        share = share_of(f"127.0.0.1:{port}", "t", 0, 2, (WAITING, 70.0, "recv"), W)
        assert share is not None
        host.send_signal(signal.SIGSTOP)
        began = time.monotonic()
        heard = heard_from(share_and_hear(share_request(share), sys.executable), 2, W)
        took = time.monotonic() - began
        assert heard.error is not None and took < 45.0, (heard, took)
        # the helper's own deadline answered, before the daemon's bound ended it
        assert "the store did not answer" in heard.error, heard.error
        assert world_stuck(heard, 0, 1e6, 60.0) is None
        print(f"a frozen store host: an error after {took:.1f} s")
    finally:
        host.send_signal(signal.SIGCONT)
        host.kill()
        host.communicate()


def test_an_elastic_range_is_judged_on_the_nodes_present() -> None:
    """``--nnodes 1:2`` with one node present: the workers' WORLD_SIZE over LOCAL_WORLD_SIZE
    says one node (never the range's top), and their MASTER_ADDR:PORT names the round."""
    from dflashd.supervisor.model.stacks import Role
    from dflashd.supervisor.model.world import world_of
    from dflashd.supervisor.watch.worldshare import nodes_present

    alone = [Role("worker", 0, 0, 2, 2, 0), Role("worker", 1, 1, 2, 2, 0)]
    both = [Role("worker", 2, 0, 4, 2, 1)]
    assert nodes_present(alone) == 1 and nodes_present(both) == 2
    assert (
        nodes_present([Role("root")]) is None
        and nodes_present([Role("worker", 0, 0, 3, 2)]) is None
    )
    assert world_of("10.0.0.1", "29500", "job") == "10.0.0.1:29500/job"
    assert world_of(None, "29500", "job") is None
    assert (
        share_of("h:1", "job", 0, nodes_present(alone), (WAITING, 70.0, "recv")) is None
    )  # one node
