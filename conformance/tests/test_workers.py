"""The worker group behind the multi-process checks: its ranks share one real gloo process group across calls, a
failure is reported by the call that caused it with the rank's traceback, and a rank that dies or hangs fails its
call within the timeout, after which the group starts afresh. The failure cases use a group of their own, so the
session's shared one is not restarted by them."""
from __future__ import annotations

import os
import time

import pytest

from pai_zoo_conformance.workers import WorkerError, WorkerGroup

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)


def rank_sum():
    """Every rank's rank + 1, summed by a real all_reduce."""
    import torch

    value = torch.tensor([torch.distributed.get_rank() + 1.0])
    torch.distributed.all_reduce(value)
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), value.item(), os.getpid()


def seen_by_rank(name):
    return os.environ.get(name), os.getcwd()


def raise_on_rank_1():
    import torch

    if torch.distributed.get_rank() == 1:
        raise ValueError("boom on rank 1")
    return "fine"


def die_on_rank_1():
    import torch

    if torch.distributed.get_rank() == 1:
        os._exit(7)
    return "fine"


def hang_on_rank_1(seconds):
    import torch

    if torch.distributed.get_rank() == 1:
        time.sleep(seconds)
    return "fine"


def fail_before_a_collective():
    """Rank 0 raises; rank 1 then waits in an all_reduce that rank 0 never joins."""
    import torch

    if torch.distributed.get_rank() == 0:
        raise RuntimeError("rank 0 gave up")
    torch.distributed.all_reduce(torch.ones(1))
    return "unreachable"


def test_the_ranks_share_one_process_group_across_calls(pai_zoo_workers):
    first = pai_zoo_workers.run(rank_sum)
    starts = pai_zoo_workers.starts
    second = pai_zoo_workers.run(rank_sum)
    assert [r[:3] for r in first] == [(0, 2, 3.0), (1, 2, 3.0)]
    assert [r[3] for r in second] == [r[3] for r in first]  # the same two processes served both calls
    assert pai_zoo_workers.starts == starts
    assert len({r[3] for r in first} | {os.getpid()}) == 3  # two processes, neither of them this one


def test_a_call_gets_the_callers_environment_and_directory(pai_zoo_workers, monkeypatch, tmp_path):
    monkeypatch.setenv("PAI_ZOO_WORKER_TEST", "from the caller")
    monkeypatch.chdir(tmp_path)
    assert pai_zoo_workers.run(seen_by_rank, "PAI_ZOO_WORKER_TEST") == [("from the caller", str(tmp_path))] * 2
    monkeypatch.delenv("PAI_ZOO_WORKER_TEST")
    assert pai_zoo_workers.run(seen_by_rank, "PAI_ZOO_WORKER_TEST")[0][0] is None


@pytest.fixture(scope="module")
def group():
    # a 4 s grace (the session's group: 10 s): the two tests of a rank left waiting after another failed wait it out
    workers = WorkerGroup(2, timeout=60, grace=4)
    yield workers
    workers.close()


def test_a_raising_rank_is_reported_with_its_traceback(group):
    with pytest.raises(WorkerError) as info:
        group.run(raise_on_rank_1)
    message = str(info.value)
    assert "raise_on_rank_1" in message and "rank 1 raised" in message
    assert 'raise ValueError("boom on rank 1")' in message and "ValueError: boom on rank 1" in message
    assert "rank 0" not in message  # rank 0 succeeded
    starts = group.starts
    assert group.run(rank_sum)[0][2] == 3.0 and group.starts == starts  # both ranks answered: the group goes on


def test_a_rank_that_dies_fails_its_call_and_the_group_restarts(group):
    group.run(rank_sum)
    starts = group.starts
    with pytest.raises(WorkerError, match=r"rank 1 died \(exit status"):
        group.run(die_on_rank_1)
    assert not group.alive
    assert group.run(rank_sum)[0][2] == 3.0 and group.starts == starts + 1


def test_a_hung_rank_fails_its_call_within_the_timeout(group):
    group.run(rank_sum)
    starts = group.starts
    began = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank\(s\) 1 did not answer within the timeout") as info:
        group.run(hang_on_rank_1, 120, timeout=3)
    assert time.monotonic() - began < 30
    assert "rank 0 returned:\n'fine'" in str(info.value)  # what the rank that did answer said
    assert 'in hang_on_rank_1' in str(info.value)  # where the late rank was: its stack, from the log
    assert group.run(rank_sum)[0][2] == 3.0 and group.starts == starts + 1


def test_a_rank_left_waiting_in_a_collective_does_not_hold_the_call(group):
    began = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.run(fail_before_a_collective)
    assert "rank 0 raised" in str(info.value) and "RuntimeError: rank 0 gave up" in str(info.value)
    assert "rank(s) 1 did not finish after rank 0 failed" in str(info.value)
    assert time.monotonic() - began < 40  # the grace period, not the call's 60 s timeout
    assert group.run(rank_sum)[0][2] == 3.0


def exit_code_on_rank_0():
    """Rank 0 returns a failed run (as ``run_cli`` does for ``pai-zoo`` exiting 1); rank 1 waits in an all_reduce."""
    import subprocess

    import torch

    if torch.distributed.get_rank() == 0:
        return subprocess.CompletedProcess(["pai-zoo"], 1, "", "pai-zoo: error: the checkpoint is incomplete")
    torch.distributed.all_reduce(torch.ones(1))
    return subprocess.CompletedProcess(["pai-zoo"], 0, "", "")


def test_a_failed_result_gives_the_others_only_the_grace_period(group):
    began = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.run(exit_code_on_rank_0, failed=lambda r: r.returncode != 0)
    message = str(info.value)
    assert time.monotonic() - began < 40  # the grace period, not the call's 60 s timeout
    assert "rank(s) 1 did not finish after rank 0 failed" in message
    assert "rank 0 returned:\nexit code 1" in message and "the checkpoint is incomplete" in message
    assert "in exit_code_on_rank_0" in message  # rank 1's stack: where it waited
    assert group.run(rank_sum)[0][2] == 3.0


def test_failed_results_from_every_rank_are_returned(group):
    """``failed`` only shortens the wait: when every rank answers, the results come back as they are."""
    results = group.run(seen_by_rank, "HOME", failed=lambda r: True)
    assert [r[1] for r in results] == [os.getcwd()] * 2


def make_groups_and_count_threads():
    """Megatron-core's model-parallel groups made in this call (as every TP/PP check makes them); returns the
    process groups and threads this rank holds."""
    import threading

    from torch.distributed.distributed_c10d import _world

    from pai_zoo.mcore.compat import ensure_model_parallel

    ensure_model_parallel(2, 1)
    return len(_world.pg_map), threading.active_count()


def count_groups_and_threads():
    import threading

    from torch.distributed.distributed_c10d import _world

    return len(_world.pg_map), threading.active_count()


@pytest.mark.megatron
def test_the_groups_a_call_makes_go_with_it(pai_zoo_workers):
    """Each call's megatron-core groups (and their gloo threads) are destroyed after it: many calls do not pile
    them up in the ranks."""
    before = pai_zoo_workers.run(count_groups_and_threads)
    during = [pai_zoo_workers.run(make_groups_and_count_threads) for _ in range(3)]
    after = pai_zoo_workers.run(count_groups_and_threads)
    assert all(groups > before[0][0] for groups, _ in during[0])  # the call made groups
    assert during[0] == during[2]  # the third call holds no more than the first
    assert after == before  # only the world group is left
