import torch

from minedraft.engine.detokenizer import DecodeState
from minedraft.engine.scheduler import Scheduler
from minedraft.engine.sequence import Sequence, Status
from minedraft.kv_cache import KVCache
from minedraft.sampling import SamplingParams


def sequence(i: int, prompt_len: int) -> Sequence:
    return Sequence(i, str(i), 0, None, [1] * prompt_len, SamplingParams(), None, DecodeState(0, 0))


def test_prefills_fill_the_budget_and_alternate_with_decode_steps():
    cache = KVCache(1, 4, 64, 1, 2, torch.float32, torch.device("cpu"))
    scheduler = Scheduler(cache, max_num_batched_tokens=20)
    seqs = [sequence(i, 10) for i in range(4)]
    for seq in seqs[:3]:
        scheduler.add(seq)
    assert scheduler.schedule() == (seqs[:2], True)  # two rows of 10 fit the budget of 20, three do not
    scheduler.add(seqs[3])
    assert scheduler.schedule() == (seqs[:2], False)  # the running ones decode before the next prefill
    assert scheduler.schedule() == (seqs[2:], True)
    assert scheduler.schedule() == (seqs, False)
    scheduler.finish(seqs[0], "stop")
    assert seqs[0].status == Status.FINISHED and scheduler.schedule() == (seqs[1:], False)


def test_the_budget_counts_prompt_tokens_not_padding():
    cache = KVCache(1, 4, 64, 1, 2, torch.float32, torch.device("cpu"))
    scheduler = Scheduler(cache, max_num_batched_tokens=12)
    short, long, other = sequence(0, 2), sequence(1, 10), sequence(2, 1)
    for seq in (short, long, other):
        scheduler.add(seq)
    assert scheduler.schedule() == ([short, long], True)  # 12 tokens (padded to 10 each they were 20)


def test_with_nothing_running_prefills_follow_each_other():
    cache = KVCache(1, 2, 64, 1, 2, torch.float32, torch.device("cpu"))
    scheduler = Scheduler(cache, max_num_batched_tokens=10)
    a, b = sequence(0, 10), sequence(1, 10)
    scheduler.add(a)
    scheduler.add(b)
    assert scheduler.schedule() == ([a], True)
    scheduler.finish(a, "abort")
    assert scheduler.schedule() == ([b], True)
