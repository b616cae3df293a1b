"""Standard speculative decoding (`sd`): greedy equality with AR, distribution, metrics, config."""

import pytest
import torch

from conftest import reference_probabilities, save_distilled_draft, save_tiny_checkpoint
from minedraft import LLM, SamplingParams
from minedraft.spec_decode.metrics import SpecDecodeMetrics
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.models.draft_format import draft_vocab
from minedraft.models.loader import load_model, read_safetensors
from minedraft.spec_decode.remote import RemoteDrafter

PROMPTS = [[5, 17, 3, 44, 9, 2, 61], [8], [90, 12, 33, 33, 1, 7, 7, 7, 70, 4, 11, 2, 3], [40, 41], [66] * 20]


def token_ids(outputs):
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def ar(tiny_llama):
    return LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96)


def greedy_params():
    # Different lengths: rows finish at different steps, some inside a round of drafts.
    return [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (23, 40, 7, 31, 12)]


@pytest.mark.parametrize("k,chunk", [(1, None), (2, None), (3, None), (3, 4), (4, None), (5, None), ("auto", None),
                                     ("auto", 5)])
def test_greedy_sd_equals_ar(ar, tiny_llama, tiny_draft, k, chunk):
    """Chunk: prompts prefilled that many tokens a step, beside the verification rows."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    expected = token_ids(ar.generate(prompts, greedy_params(), use_tqdm=False))
    sd = LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96, max_num_batched_tokens=chunk,
             speculative_config={"model": str(tiny_draft), "num_speculative_tokens": k})
    assert token_ids(sd.generate(prompts, greedy_params(), use_tqdm=False)) == expected
    m = sd.get_metrics()
    assert sd.engine.runner.cache.num_free == 4 and sd.engine.proposer.runner.cache.num_free == 4
    if k == "auto":  # it may switch this weak drafter off (k = 0); it drafted at first
        assert m["num_draft_tokens"] > 0 and m["acceptance_rate"] < 1
        assert 0 <= m["draft_length"]["k"] <= 8 and all(0 <= a <= 1 for a in m["draft_length"]["acceptance"])
    else:
        assert 0 < m["acceptance_rate"] < 1  # the test exercises both acceptance and rejection


@pytest.mark.parametrize("placement", [{}, {"draft_device": "cpu"}, {"parallel": True}], ids=["sd", "sd-remote", "psd"])
def test_greedy_lookup_first_equals_ar(ar, tiny_llama, tiny_draft, placement):
    """Prompt lookup in front of a draft model: rows with a match skip the model's round, which
    then catches up on every token they kept."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    expected = token_ids(ar.generate(prompts, greedy_params(), use_tqdm=False))
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96,
             speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3, **LOOKUP_FIRST,
                                 **placement}) as sd:
        if not placement:  # count whose drafts the rounds took
            counts = {"lookup": 0, "model": 0}
            for name in counts:
                inner = getattr(sd.engine.proposer, name)
                inner.propose = counting(inner.propose, counts, name)
        assert token_ids(sd.generate(prompts, greedy_params(), use_tqdm=False)) == expected
        m = sd.get_metrics()
        assert 0 < m["acceptance_rate"] < 1 and m["drafter_failures"] == 0
        if not placement:
            assert counts["lookup"] > 0 and counts["model"] > 0, counts


def counting(propose, counts, name):
    def wrapped(seqs, num_tokens, *args):
        drafts, dists = propose(seqs, num_tokens, *args)
        counts[name] += sum(len(d) for d in drafts)
        return drafts, dists
    return wrapped


def test_greedy_sd_stops_at_max_model_len(tiny_llama, tiny_draft):
    prompts = [{"prompt_token_ids": PROMPTS[4]}]
    params = SamplingParams(temperature=0, max_tokens=33 - 20, ignore_eos=True)  # all the context leaves
    kwargs = dict(dtype="float64", max_num_seqs=2, max_model_len=33)
    ar = LLM(str(tiny_llama), **kwargs)
    sd = LLM(str(tiny_llama), **kwargs, speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 5})
    assert token_ids(sd.generate(prompts, params, use_tqdm=False)) == token_ids(ar.generate(prompts, params, use_tqdm=False))
    assert len(token_ids(sd.generate(prompts, params, use_tqdm=False))[0]) == 33 - 20


def test_self_drafting_accepts_everything_and_metrics_are_exact(tiny_llama):
    sd = LLM(str(tiny_llama), dtype="float64", max_num_seqs=2, max_model_len=64,
             speculative_config={"model": "self", "num_speculative_tokens": 3})
    # 9 tokens: 1 from prefill, then two rounds of 3 accepted drafts + 1 bonus token.
    sd.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(temperature=0, max_tokens=9, ignore_eos=True),
                use_tqdm=False)
    assert sd.get_metrics() == {"num_drafts": 2, "num_draft_tokens": 6, "num_accepted_tokens": 6,
                                "accepted_per_position": [2, 2, 2], "acceptance_rate": 1.0,
                                "mean_acceptance_length": 4.0, "num_steps": 2, "num_overlapped_steps": 0,
                                "drafter_failures": 0, "num_prompts_prefilled_by_drafter": 0}


def test_metrics_arithmetic():
    m = SpecDecodeMetrics()
    for drafted, accepted in [(4, 0), (4, 2), (4, 4), (2, 1), (0, 0)]:
        m.observe(drafted, accepted)
    assert m.as_dict() == {"num_drafts": 4, "num_draft_tokens": 14, "num_accepted_tokens": 7,
                           "accepted_per_position": [3, 2, 1, 1], "acceptance_rate": 0.5,
                           "mean_acceptance_length": 2.75, "num_steps": 0, "num_overlapped_steps": 0,
                           "drafter_failures": 0, "num_prompts_prefilled_by_drafter": 0}


def test_seeded_sd_is_reproducible(tiny_llama, tiny_draft):
    def run():
        sd = LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96,
                 speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3})
        params = SamplingParams(temperature=1.0, top_k=20, seed=11, max_tokens=25, ignore_eos=True)
        return token_ids(sd.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False))

    assert run() == run()


def exact_second_token_distribution(folder, prompt, params=SamplingParams()):
    """P(second output token) under the target at `params` (temperature 1 by default): sum over
    the first token."""
    model = load_model(folder, torch.float64, torch.device("cpu"))
    vocab = model.args.vocab_size
    runner = ModelRunner(model, vocab, 64, torch.float64, torch.device("cpu"))
    slot = runner.cache.allocate()
    first = reference_probabilities(runner.forward([Row(slot, prompt)])[0], params)
    slots = [runner.cache.allocate() for _ in range(vocab - 1)]
    rows = [Row(slot, [0])] + [Row(s, prompt + [y]) for s, y in zip(slots, range(1, vocab))]
    runner.cache.truncate(slot, len(prompt))
    second = torch.stack([reference_probabilities(row, params) for row in runner.forward(rows)])
    return first @ second


def second_token_histogram(llm, prompt, n, vocab, **truncation):
    params = SamplingParams(n=n, temperature=1.0, max_tokens=4, ignore_eos=True, seed=123, **truncation)
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    counts = torch.bincount(torch.tensor([o.token_ids[1] for o in out.outputs]), minlength=vocab)
    return counts.double() / n


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    """Target and draft with 12 tokens: few categories keep the sampling noise low."""
    root = tmp_path_factory.mktemp("small_vocab")
    return (save_tiny_checkpoint(root / "target", "llama", vocab_size=12),
            save_tiny_checkpoint(root / "draft", "llama", seed=3, vocab_size=12, num_hidden_layers=1))


LOOKUP_FIRST = {"prompt_lookup_first": True, "prompt_lookup_min": 1}
# With this prompt 0.41 of the target's first tokens (2,000 samples) occur in it, so about that
# share of the second-token rounds take a lookup draft and the rest the model's: both paths run
# ([1, 5, 7, 2] gave 0.05).
LOOKUP_PROMPT = [9, 10, 11, 0, 1, 5, 7, 2]
CHUNKED = {"max_num_batched_tokens": 30}  # 7.5 prompts of 4 tokens a step: one split every step


@pytest.mark.parametrize("placement,engine", [
    ({}, {}), ({"parallel": True}, {}), ({"draft_device": "cpu"}, {}), ({"num_speculative_tokens": "auto"}, {}),
    ({"tetris": True, "tetris_extra_proposals": 2, "tetris_capacity": 40}, {}), ({}, CHUNKED),
    ({"parallel": True}, CHUNKED), (LOOKUP_FIRST, {}), ({"parallel": True, **LOOKUP_FIRST}, {}),
    ({"num_speculative_tokens": "auto", **LOOKUP_FIRST}, {}),
    ({"parallel": True, "num_speculative_tokens": "auto", **LOOKUP_FIRST}, {})],
    ids=["sd", "psd", "sd-remote", "sd-auto", "sd-tetris", "sd-chunked", "psd-chunked", "sd-lookup-first",
         "psd-lookup-first", "sd-lookup-first-auto", "psd-lookup-first-auto"])
def test_speculation_samples_the_targets_distribution(small_vocab_pair, placement, engine):
    """At temperature 1 the second token (the first one speculation produces) follows the target's
    exact distribution; the draft's own distribution is far from it, so a sampler that leaned on
    the draft would fail. Chunked: prompts split over steps, beside verification rows."""
    target, draft = small_vocab_pair
    prompt = LOOKUP_PROMPT if placement.get("prompt_lookup_first") else [1, 5, 7, 2]
    exact = exact_second_token_distribution(target, prompt)
    draft_exact = exact_second_token_distribution(draft, prompt)
    sd = LLM(str(target), dtype="float64", max_num_seqs=64, max_model_len=32, **engine,
             speculative_config={"model": str(draft), "num_speculative_tokens": 2, **placement})
    n = 6000
    empirical = second_token_histogram(sd, prompt, n, exact.numel())
    tv = 0.5 * (empirical - exact).abs().sum().item()
    tv_draft = 0.5 * (draft_exact - exact).abs().sum().item()
    # Expected TV of n exact samples: 0.5 * sum_i E|p_hat_i - p_i| ~ 0.5 * sum_i sqrt(2 p_i (1 - p_i) / (pi n)).
    noise = 0.5 * torch.sqrt(2 * exact * (1 - exact) / (torch.pi * n)).sum().item()
    assert sd.get_metrics()["num_accepted_tokens"] > 0
    assert tv < 1.5 * noise, (tv, noise)
    assert tv_draft > 4 * noise, (tv_draft, noise)
    sd.close()


@pytest.mark.parametrize("placement", [{}, {"parallel": True}], ids=["sd", "psd"])
def test_greedy_sd_with_a_reduced_vocabulary_drafter_equals_ar(ar, tiny_llama, tiny_distilled, placement):
    """The drafter train-draft makes: shared embedding, head over two thirds of the vocabulary."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    expected = token_ids(ar.generate(prompts, greedy_params(), use_tqdm=False))
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96,
             speculative_config={"model": str(tiny_distilled), "num_speculative_tokens": 3, **placement}) as sd:
        assert token_ids(sd.generate(prompts, greedy_params(), use_tqdm=False)) == expected
        assert 0 < sd.get_metrics()["acceptance_rate"] < 1


@pytest.mark.parametrize("placement", [{}, {"draft_device": "cpu"}], ids=["sd", "sd-remote"])
def test_a_reduced_vocabulary_drafter_keeps_the_targets_distribution(small_vocab_pair, tmp_path, placement):
    """Tokens outside the draft vocabulary have draft probability 0: only the residual can
    produce them, and the output must still follow the target exactly (the draft distributions
    stay over the draft vocabulary, in the drafter's process and across processes)."""
    target, _ = small_vocab_pair
    draft = save_distilled_draft(tmp_path, target, init_layers=(0,))
    prompt = [1, 5, 7, 2]
    exact = exact_second_token_distribution(target, prompt)
    sd = LLM(str(target), dtype="float64", max_num_seqs=64, max_model_len=32,
             speculative_config={"model": str(draft), "num_speculative_tokens": 2, **placement})
    n = 6000
    empirical = second_token_histogram(sd, prompt, n, exact.numel())
    assert sd.get_metrics()["num_accepted_tokens"] > 0
    assert empirical[::3].sum() > 0.1  # tokens the drafter cannot propose do come out
    # Pearson's chi-square with 11 degrees of freedom; 31.26 is its 0.999 quantile: a lossless
    # sampler fails one seed in a thousand.
    chi2 = (n * (empirical - exact) ** 2 / exact).sum().item()
    assert chi2 < 31.26, chi2
    sd.close()


def test_top_k_and_top_p_drafts_across_processes_keep_the_targets_distribution(small_vocab_pair, tmp_path):
    """A reduced-vocabulary drafter in its own process at top-k / top-p: each draft distribution
    travels as its survivors alone, and the output follows the target's truncated distribution."""
    target, _ = small_vocab_pair
    draft = save_distilled_draft(tmp_path, target, init_layers=(0,))
    prompt = [1, 5, 7, 2]
    truncation = {"top_k": 6, "top_p": 0.9}
    exact = exact_second_token_distribution(target, prompt, SamplingParams(**truncation))
    sd = LLM(str(target), dtype="float64", max_num_seqs=64, max_model_len=32,
             speculative_config={"model": str(draft), "num_speculative_tokens": 2, "draft_device": "cpu"})
    n = 6000
    empirical = second_token_histogram(sd, prompt, n, exact.numel(), **truncation)
    tv = 0.5 * (empirical - exact).abs().sum().item()
    noise = 0.5 * torch.sqrt(2 * exact * (1 - exact) / (torch.pi * n)).sum().item()
    assert sd.get_metrics()["num_accepted_tokens"] > 0
    assert empirical[exact == 0].sum() == 0 and tv < 1.5 * noise, (tv, noise)
    sd.close()


def test_drafts_cross_processes_compact(tiny_llama, tiny_distilled, monkeypatch):
    """Greedy rows' drafts come as token ids alone; sampled rows' distributions over the draft
    vocabulary (sent once per answer), or over each row's top-k survivors."""
    received = []
    collect = RemoteDrafter.collect
    monkeypatch.setattr(RemoteDrafter, "collect", lambda self: received.append(collect(self)) or received[-1])
    vocab = draft_vocab(read_safetensors(tiny_distilled))
    prompts = [{"prompt_token_ids": p} for p in PROMPTS[:2]]
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96,
             speculative_config={"model": str(tiny_distilled), "num_speculative_tokens": 3, "draft_device": "cpu"}) as sd:
        for params, check in [
            (SamplingParams(temperature=0), lambda q: q is None),
            (SamplingParams(temperature=0.8, seed=1), lambda q: torch.equal(q.ids, vocab) and q.probs.shape[1] == len(vocab)),
            (SamplingParams(top_k=3, seed=2), lambda q: q.ids.dim() == 2 and q.probs.shape[1] <= 3),
        ]:
            received.clear()
            sd.generate(prompts, SamplingParams(**{**params.as_dict(), "max_tokens": 8, "ignore_eos": True}),
                        use_tqdm=False)
            dists = [q for answer in received for d, q in answer.values() if d]
            assert dists and all(check(q) for q in dists), params


@pytest.mark.parametrize("placement", [{}, {"parallel": True}], ids=["sd", "psd"])
def test_greedy_tetris_equals_ar_and_gives_rows_different_draft_lengths(ar, tiny_llama, tiny_draft, placement):
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    expected = token_ids(ar.generate(prompts, greedy_params(), use_tqdm=False))
    spec = {"model": str(tiny_draft), "num_speculative_tokens": 2, "tetris": True, "tetris_extra_proposals": 2}
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96, trace=True,
             speculative_config={**spec, **placement}) as sd:
        assert token_ids(sd.generate(prompts, greedy_params(), use_tqdm=False)) == expected
        verified = [e for e in sd.engine.trace if e["kind"] == "verify"]
        assert sd.get_metrics()["num_accepted_tokens"] > 0
    # Capacity: k = 2 drafts per row on average in every verification; rows differ, some keep more than k.
    assert all(sum(e["drafted"]) <= 2 * e["size"] for e in verified)
    assert any(max(e["drafted"]) > 2 for e in verified) and any(min(e["drafted"]) < 2 for e in verified)


NGRAM = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.mark.parametrize("k", [3, "auto"])
def test_greedy_ngram_drafting_equals_ar(ar, tiny_llama, k):
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    expected = token_ids(ar.generate(prompts, greedy_params(), use_tqdm=False))
    sd = LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96,
             speculative_config={**NGRAM, "num_speculative_tokens": k})
    assert token_ids(sd.generate(prompts, greedy_params(), use_tqdm=False)) == expected
    m = sd.get_metrics()
    assert m["num_draft_tokens"] > 0 and m["acceptance_rate"] < 1
    assert m["acceptance_rate"] > 0 or k == "auto"  # auto may switch drafting off early here


def test_auto_counts_drafts_asked_for_and_not_made_as_rejected(tiny_llama, tiny_draft):
    """A row the lookup found nothing for yields one token, not the draft's acceptance rate: the
    controller must see the drafts it asked for as tried (and rejected), or it overrates k."""
    spec = {"model": str(tiny_draft), **LOOKUP_FIRST, "num_speculative_tokens": "auto"}
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96, speculative_config=spec,
             trace=True) as sd:
        controller = sd.engine.draft_length
        seen, observe = [], controller.observe_verify
        controller.observe_verify = lambda seconds, k, rows, hindsight=(): (seen.append((k, rows)),
                                                                           observe(seconds, k, rows, hindsight))
        sd.generate([{"prompt_token_ids": p} for p in PROMPTS], greedy_params(), use_tqdm=False)
    # The controller learns from verifications without prompt chunks, and from plain steps (k = 0).
    verified = [e for e in sd.engine.trace if e["kind"] == "verify" and "prompt_tokens" not in e]
    seen = [(k, rows) for k, rows in seen if k]
    assert len(seen) == len(verified) > 0
    short = 0
    for (k, rows), e in zip(seen, verified):
        assert [accepted for _, accepted in rows] == e["accepted"]
        assert all(asked >= drafted for (asked, _), drafted in zip(rows, e["drafted"]))
        short += sum(asked > drafted for (asked, _), drafted in zip(rows, e["drafted"]))
    assert short > 0  # rows got fewer drafts than asked, and were counted at the length asked


@pytest.mark.parametrize("mode", ["sd-ngram", "psd-lookup-first"])
def test_auto_keeps_measuring_a_free_drafter_while_it_plays_k_0(ar, tiny_llama, tiny_draft, mode):
    """Held at k = 0, nothing is verified, yet the prompt lookup's drafts are scored against what
    the target emits: the controller learns their acceptance at every position. In psd the lookup
    sits in the drafter's process; the engine runs the same one while the drafter's last answer
    said its model was gated off (set here: at k = 0 no answer comes)."""
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    expected = token_ids(ar.generate(prompts, greedy_params(), use_tqdm=False))
    spec = {**NGRAM} if mode == "sd-ngram" else {"model": str(tiny_draft), "parallel": True, **LOOKUP_FIRST}
    with LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96, trace=True,
             speculative_config={**spec, "num_speculative_tokens": "auto"}) as sd:
        if mode != "sd-ngram":
            sd.engine.proposer.free = True
        controller = sd.engine.draft_length
        controller.k = 0
        controller.plan = lambda *args, **kwargs: 0
        scored, score = [], controller.hindsight.score

        def spy(seqs):
            rows = score(seqs)
            scored.extend(rows)
            return rows

        controller.hindsight.score = spy
        assert token_ids(sd.generate(prompts, greedy_params(), use_tqdm=False)) == expected
    assert not [e for e in sd.engine.trace if e["kind"] == "verify"]
    assert scored and all(asked == controller.max_k for asked, _ in scored)
    assert any(accepted >= 2 for _, accepted in scored)  # [66] * 20 is copied: long matches
    assert len(controller.acceptance) >= 3 and controller.acceptance[1] > 0


def test_ngram_drafting_keeps_the_targets_distribution(small_vocab_pair):
    """Lookup drafts are certain (q one-hot): kept with probability p(x), else the residual."""
    target, _ = small_vocab_pair
    prompt = [1, 5, 7, 2, 1, 5, 7, 2, 3, 4, 6, 8, 9, 10, 11, 0]  # every token occurs: always a draft
    exact = exact_second_token_distribution(target, prompt)
    sd = LLM(str(target), dtype="float64", max_num_seqs=64, max_model_len=32,
             speculative_config={**NGRAM, "num_speculative_tokens": 2})
    n = 6000
    empirical = second_token_histogram(sd, prompt, n, exact.numel())
    tv = 0.5 * (empirical - exact).abs().sum().item()
    noise = 0.5 * torch.sqrt(2 * exact * (1 - exact) / (torch.pi * n)).sum().item()
    assert sd.get_metrics()["num_accepted_tokens"] > 0
    assert tv < 1.5 * noise, (tv, noise)


@pytest.mark.parametrize("spec,message", [
    ({"model": "self", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"model": "self", "num_speculative_tokens": 17}, "num_speculative_tokens"),
    ({"model": "self", "num_speculative_tokens": "fast"}, 'integer in 1..16 or "auto"'),
    ({"model": "self", "num_speculative_tokens": 2, "bogus": 1}, "unknown speculative_config key 'bogus'"),
    ({"model": "self"}, "num_speculative_tokens"),
    ({"model": "self", "num_speculative_tokens": 2, "method": "eagle"}, "method"),
    ({"model": "/no/such/draft", "num_speculative_tokens": 2}, "does not exist"),
    ({"method": "ngram", "model": "self", "num_speculative_tokens": 2}, "drop 'model'"),
    ({"method": "ngram", "parallel": True, "num_speculative_tokens": 2}, "engine's process"),
    ({"method": "ngram", "tetris": True, "num_speculative_tokens": 2}, "tetris ranks drafts"),
    ({"model": "self", "tetris": True, "tetris_extra_proposals": -1, "num_speculative_tokens": 2},
     "tetris_extra_proposals must be an integer >= 0"),
    ({"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2, "num_speculative_tokens": 2},
     "prompt_lookup_min <= prompt_lookup_max"),
    ({"method": "ngram", "prompt_lookup_first": True, "num_speculative_tokens": 2}, "prompt lookup alone"),
    ({"model": "self", "prompt_lookup_first": True, "tetris": True, "num_speculative_tokens": 2}, "tetris ranks drafts"),
    ({"model": "self", "prompt_lookup_first": "yes", "num_speculative_tokens": 2}, "must be true or false"),
    ({"model": "self", "prompt_lookup_first": True, "prompt_lookup_min": 0, "num_speculative_tokens": 2},
     "1 <= prompt_lookup_min"),
])
def test_bad_speculative_config_is_named(tiny_llama, spec, message):
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        LLM(str(tiny_llama), dtype="float64", speculative_config=spec)


def test_draft_vocabulary_must_match(tiny_llama, tmp_path):
    other = save_tiny_checkpoint(tmp_path, "llama", vocab_size=50)
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(str(tiny_llama), speculative_config={"model": str(other), "num_speculative_tokens": 2})


def test_self_drafting_on_smollm2_accepts_nearly_everything(smollm2_path):
    sd = LLM(str(smollm2_path), max_num_seqs=4, max_model_len=256,
             speculative_config={"model": "self", "num_speculative_tokens": 4})
    prompts = [[{"role": "user", "content": q}] for q in
               ("What is the capital of France?", "Name three colours.", "Write a haiku about the sea.")]
    sd.chat(prompts, SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    assert sd.get_metrics()["acceptance_rate"] >= 0.99


def test_logprobs_are_the_same_with_and_without_speculation(ar, tiny_llama, tiny_draft):
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=3) for n in (23, 40, 7, 31, 12)]
    sd = LLM(str(tiny_llama), dtype="float64", max_num_seqs=4, max_model_len=96,
             speculative_config={"model": str(tiny_draft), "num_speculative_tokens": 3})
    for a, s in zip(ar.generate(prompts, params, use_tqdm=False), sd.generate(prompts, params, use_tqdm=False)):
        a, s = a.outputs[0], s.outputs[0]
        assert len(a.logprobs) == len(a.token_ids) and a.token_ids == s.token_ids
        for token, la, ls in zip(a.token_ids, a.logprobs, s.logprobs):
            assert la.keys() == ls.keys() and len(la) == 3 and max(la, key=la.get) == token  # greedy: the top one
            assert all(abs(la[t] - ls[t]) < 1e-9 for t in la)
