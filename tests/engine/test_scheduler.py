import torch

from minedraft.engine.detokenizer import DecodeState
from minedraft.engine.scheduler import PrefillPacer, Scheduler
from minedraft.engine.sequence import Sequence, Status
from minedraft.kv_cache import KVCache


def sequence(i: int, prompt_len: int) -> Sequence:
    from minedraft.sampling import SamplingParams

    return Sequence(i, str(i), 0, None, [1] * prompt_len, SamplingParams(), None, DecodeState(0, 0))


def run(scheduler: Scheduler) -> tuple[list[int], list[tuple[int, int]]]:
    """Schedule a step and play the runner: advance the cache, give finished prompts a token.
    Returns the decoding sequences' ids and the (id, prompt tokens) chunks."""
    step = scheduler.schedule()
    for seq in step.running:
        scheduler.cache.lengths[seq.slot] = len(seq)
        seq.output_token_ids.append(7)
    for seq, n in step.chunks:
        scheduler.cache.lengths[seq.slot] += n
        if scheduler.cache.lengths[seq.slot] == len(seq.prompt_token_ids):
            seq.output_token_ids.append(7)
    return [s.seq_id for s in step.running], [(s.seq_id, n) for s, n in step.chunks]


def test_prompts_are_split_into_chunks_beside_the_running_streams():
    cache = KVCache(1, 3, 64, 1, 2, torch.float32, torch.device("cpu"))
    scheduler = Scheduler(cache, max_num_batched_tokens=8)
    seqs = [sequence(i, n) for i, n in enumerate((5, 10, 3, 2))]
    for seq in seqs[:3]:
        scheduler.add(seq)
    assert run(scheduler) == ([], [(0, 5), (1, 3)])  # the budget of 8 prompt tokens, split
    assert run(scheduler) == ([0], [(1, 7), (2, 1)])  # the begun prompt first; 0 decodes beside
    scheduler.add(seqs[3])  # no free slot: it waits
    assert run(scheduler) == ([0, 1], [(2, 2)])
    scheduler.finish(seqs[0], "stop")
    assert seqs[0].status == Status.FINISHED and seqs[0].slot is None
    assert run(scheduler) == ([1, 2], [(3, 2)])  # admitted into the freed slot
    assert run(scheduler) == ([1, 2, 3], [])


def test_without_chunking_prompts_go_whole_and_the_first_always_fits():
    cache = KVCache(1, 4, 64, 1, 2, torch.float32, torch.device("cpu"))
    scheduler = Scheduler(cache, max_num_batched_tokens=8, chunked=False)
    seqs = [sequence(i, n) for i, n in enumerate((12, 4, 4, 3))]
    for seq in seqs:
        scheduler.add(seq)
    assert run(scheduler) == ([], [(0, 12)])  # longer than the budget: alone
    assert run(scheduler) == ([0], [(1, 4), (2, 4)])
    assert run(scheduler) == ([0, 1, 2], [(3, 3)])


def test_waiting_sequences_can_finish_before_admission():
    cache = KVCache(1, 1, 64, 1, 2, torch.float32, torch.device("cpu"))
    scheduler = Scheduler(cache, max_num_batched_tokens=4)
    a, b = sequence(0, 6), sequence(1, 2)
    scheduler.add(a)
    scheduler.add(b)
    assert run(scheduler) == ([], [(0, 4)])
    scheduler.finish(b, "abort")  # aborted while waiting
    assert run(scheduler) == ([], [(0, 2)])
    scheduler.finish(a, "stop")
    assert not scheduler.has_work() and cache.num_free == 1


def test_a_step_without_streams_takes_the_whole_budget_and_one_beside_them_less():
    cache = KVCache(1, 3, 128, 1, 2, torch.float32, torch.device("cpu"))
    scheduler = Scheduler(cache, max_num_batched_tokens=40, tokens_beside_streams=6)
    first, second, third = sequence(0, 50), sequence(1, 30), sequence(2, 30)
    scheduler.add(first)
    scheduler.add(second)
    assert run(scheduler) == ([], [(0, 40)])  # nobody waits on this step
    assert run(scheduler) == ([], [(0, 10), (1, 30)])  # still no stream: the whole budget
    scheduler.add(third)
    assert run(scheduler) == ([0, 1], [(2, 6)])  # streams run: 6 tokens beside them
    assert run(scheduler) == ([0, 1], [(2, 6)])
    assert Scheduler(cache, max_num_batched_tokens=8, tokens_beside_streams=20).pacer.beside == 8  # never above


def test_the_pacer_keeps_a_step_with_chunks_within_the_stall_ratio():
    pacer = PrefillPacer(stall_ratio=2.5, max_tokens=64)
    assert pacer.budget(streams=False) == 64  # nobody waits on a step of prompts alone
    assert pacer.budget(streams=True) == PrefillPacer.MIN_TOKENS  # nothing measured yet: a small chunk
    pacer.observe(0.024, streams=True, prompt_tokens=0)  # a decode step
    assert pacer.budget(streams=True) == PrefillPacer.MIN_TOKENS  # the cost of a prompt token is not known yet
    pacer.observe(0.124, streams=True, prompt_tokens=64)  # 64 tokens added 100 ms
    # 1.5 decode steps' worth of prompt tokens: 0.036 s / (0.1 s / 64) = 23.04
    assert pacer.budget(streams=True) == 23
    for _ in range(50):  # tokens get dear: the floor keeps prompts moving
        pacer.observe(1.0, streams=True, prompt_tokens=23)
    assert pacer.budget(streams=True) == PrefillPacer.MIN_TOKENS
    unpaced = PrefillPacer(stall_ratio=None, max_tokens=64)
    unpaced.observe(0.024, streams=True, prompt_tokens=0)
    unpaced.observe(0.124, streams=True, prompt_tokens=64)
    assert unpaced.budget(streams=True) == 64


def test_a_step_of_prompts_alone_prices_a_prompt_token_first():
    pacer = PrefillPacer(stall_ratio=3.0, max_tokens=512, tokens_beside_streams=100)
    pacer.observe(1.0, streams=False, prompt_tokens=500)  # 2 ms a token, the weight pass included
    pacer.observe(0.02, streams=True, prompt_tokens=0)
    assert pacer.budget(streams=True) == 20  # 2 x 20 ms / 2 ms
    pacer.observe(0.001, streams=True, prompt_tokens=0)  # decode steps get cheap: the floor
    for _ in range(30):
        pacer.observe(0.001, streams=True, prompt_tokens=0)
    assert pacer.budget(streams=True) == PrefillPacer.MIN_TOKENS
    for _ in range(30):  # and dear: never above tokens_beside_streams
        pacer.observe(1.0, streams=True, prompt_tokens=0)
    assert pacer.budget(streams=True) == 100


def test_chunks_beside_streams_take_the_pacers_budget():
    cache = KVCache(1, 2, 128, 1, 2, torch.float32, torch.device("cpu"))
    scheduler = Scheduler(cache, max_num_batched_tokens=40, stall_ratio=2.0)
    scheduler.pacer.step_s, scheduler.pacer.token_s = 0.02, 0.002  # room for 10 prompt tokens
    first, second = sequence(0, 30), sequence(1, 30)
    scheduler.add(first)
    assert run(scheduler) == ([], [(0, 30)])  # no stream runs: the whole budget
    scheduler.add(second)
    assert run(scheduler) == ([0], [(1, 10)])
    scheduler.add(sequence(2, 30))  # no slot for it: however many prompts wait, the same pacing
    assert run(scheduler) == ([0], [(1, 10)])
    unchunked = Scheduler(cache, max_num_batched_tokens=40, chunked=False, stall_ratio=2.0)
    assert unchunked.pacer.stall_ratio is None  # a prompt that must go whole is not paced




def test_shortest_prompt_first_orders_prompt_tokens_by_when_each_would_be_done():
    cache = KVCache(1, 5, 64, 1, 2, torch.float32, torch.device("cpu"))
    scheduler = Scheduler(cache, max_num_batched_tokens=40, tokens_beside_streams=10, policy="shortest_prompt")
    scheduler.observe(2.0, False, 20)  # 0.1 s a prompt token
    assert scheduler.prompt_token_s == 0.1
    seqs = [sequence(i, n) for i, n in enumerate((30, 12, 3, 25, 4))]
    for seq in seqs[:2]:
        scheduler.add(seq)
    assert run(scheduler) == ([], [(1, 12), (0, 28)])  # nobody streams: 40 tokens, the shorter prompt first
    scheduler.add(seqs[2])
    assert run(scheduler) == ([1], [(0, 2), (2, 3)])  # beside a stream: 10, the least left first
    scheduler.add(seqs[3])
    scheduler.add(seqs[4])  # arrived later but shorter: admitted and prefilled first
    assert run(scheduler) == ([1, 0, 2], [(4, 4), (3, 6)])
    assert run(scheduler) == ([1, 0, 2, 4], [(3, 10)])


def test_shortest_prompt_first_lets_no_newcomer_pass_a_prompt_that_waited_its_own_prefill_time():
    cache = KVCache(1, 4, 64, 1, 2, torch.float32, torch.device("cpu"))
    scheduler = Scheduler(cache, max_num_batched_tokens=10, policy="shortest_prompt")
    scheduler.observe(1.0, False, 10)  # 0.1 s a prompt token
    old, new = sequence(0, 30), sequence(1, 4)
    old.arrival_time -= 2.5  # waited 2.5 s of the 3 its 30 tokens take: done at +0.5 s
    for seq in (old, new):
        scheduler.add(seq)
    assert run(scheduler) == ([], [(1, 4), (0, 6)])  # the newcomer would be done at +0.4 s: it passes
    scheduler.add(sequence(2, 2))  # done at +0.2 s, but the old prompt's 24 tokens left at -0.1 s
    assert run(scheduler) == ([1], [(0, 10)])


def test_arrival_order_is_the_default_and_until_a_prompt_token_was_timed():
    cache = KVCache(1, 4, 64, 1, 2, torch.float32, torch.device("cpu"))
    for scheduler in (Scheduler(cache, max_num_batched_tokens=40),
                      Scheduler(cache, max_num_batched_tokens=40, policy="shortest_prompt")):
        long, short = sequence(0, 30), sequence(1, 4)
        scheduler.add(long)
        scheduler.add(short)
        assert run(scheduler) == ([], [(0, 30), (1, 4)])
        for seq in (long, short):
            scheduler.finish(seq, "stop")
