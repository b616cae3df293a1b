"""Draft tokens with an EAGLE-3 head (minedraft.models.eagle3) over the target's own states.

The head keeps a one-layer KV cache per sequence. Entry i pairs token i + 1 with the target's
states at position i (cache index i, as vLLM places it). The engine hands over the target's states
of every token a sequence keeps (`accept_states`); a round feeds the pairs not yet in the cache in
one pass, then chains the drafts, each step reading the head's own previous output as its feature.
The draft entries are dropped after the round; the last context pair is kept out of the cache so
that every round starts from a pass over at least one pair (its output starts the drafts).
"""

import torch

from minedraft.spec_decode.base import SlotProposer
from minedraft.spec_decode.chain import draft_chain
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.engine.sequence import Sequence
from minedraft.models.eagle3 import Eagle3Head
from minedraft.sampling import Dist


class Eagle3Proposer(SlotProposer):
    def __init__(self, head: Eagle3Head, target_layers: int, num_slots: int, max_len: int, dtype: torch.dtype,
                 device: torch.device, compile_sizes: tuple[int, ...] = (), cuda_graphs: bool = False):
        self.runner = ModelRunner(head, num_slots, max_len, dtype, device, compile_sizes, cuda_graphs)
        # Two graphs per size: the first step reads the target's three layers, later ones the head's own.
        for width in (3 * head.config.target_hidden_size, head.hidden_size):
            feature = torch.zeros(1, width, dtype=dtype, device=device)
            self.runner.warm_up("compiling the EAGLE-3 head", features=feature)
        self.aux_layers = head.config.aux_layers(target_layers)
        self.vocab = (head.draft_to_target, head.args.vocab_size)  # the head scores its draft vocabulary
        self.slots: dict[int, int] = {}
        self.states: dict[int, torch.Tensor] = {}  # seq_id -> target states of positions not yet in the cache

    def accept_states(self, seq: Sequence, start: int, states: torch.Tensor) -> None:
        if seq.seq_id not in self.slots:
            self.slot(seq)
            self.states[seq.seq_id] = states[:0]
        held = self.states[seq.seq_id]
        expected = self.runner.cache.lengths[self.slots[seq.seq_id]] + len(held)
        if start > expected:
            raise RuntimeError(f"sequence {seq.seq_id}: target states from position {start}, expected {expected}")
        self.states[seq.seq_id] = torch.cat((held, states[expected - start :]))

    def backlog(self, seq: Sequence) -> int:
        return max(len(self.states.get(seq.seq_id, ())) - 1, 0)  # the last pair stays out by design

    def prefill(self, seqs: list[Sequence], ends: list[int]) -> None:
        """Feed the pairs whose states have arrived, but the last (see the module's docstring)."""
        rows, features = [], []
        for seq in seqs:
            held = self.states.get(seq.seq_id)
            if held is None or len(held) < 2:
                continue
            slot = self.slots[seq.seq_id]
            rows.append(Row(slot, seq.tokens_from(self.runner.cache.lengths[slot] + 1)[: len(held) - 1]))
            features.append(held[:-1])
            self.states[seq.seq_id] = held[-1:]
        if rows:
            self.runner.hidden_states(rows, features=torch.cat(features))

    def propose(
        self, seqs: list[Sequence], num_tokens: list[int], generators: list[torch.Generator | None],
        capacity: int | None = None,
    ) -> tuple[list[list[int]], list[Dist | None]]:
        cache = self.runner.cache
        num_tokens = [n if s.seq_id in self.states and len(self.states[s.seq_id]) else 0
                      for s, n in zip(seqs, num_tokens)]
        active = [i for i, n in enumerate(num_tokens) if n > 0]
        context = {i: cache.lengths[self.slots[seqs[i].seq_id]] for i in active}
        previous: list[int] = []
        features = torch.empty(0)

        def step(rows: list[int], last: list[int] | None) -> torch.Tensor:
            nonlocal previous, features
            if last is None:  # the pairs not yet in the cache: tokens c + 1.. beside states c..
                states = [self.states[seqs[i].seq_id] for i in rows]
                batch = [Row(self.slots[seqs[i].seq_id], seqs[i].tokens_from(context[i] + 1)[: len(s)])
                         for i, s in zip(rows, states)]
                logits, out = self.runner.run(batch, features=torch.cat(states))
                ends = torch.tensor([len(s) for s in states]).cumsum(0) - 1
                out = out[ends]
            else:
                keep = [previous.index(i) for i in rows]
                batch = [Row(self.slots[seqs[i].seq_id], [t]) for i, t in zip(rows, last)]
                logits, out = self.runner.run(batch, features=features[keep])
            previous, features = rows, out
            return logits

        drafts, dists = draft_chain(step, [s.params for s in seqs], generators, num_tokens, capacity, self.vocab)
        for i in active:  # keep the context pairs but the last; drop the drafts' entries
            seq_id = seqs[i].seq_id
            held = self.states[seq_id]
            cache.truncate(self.slots[seq_id], context[i] + len(held) - 1)
            self.states[seq_id] = held[-1:]
        return drafts, dists

    def forget(self, seq_id: int) -> None:
        self.states.pop(seq_id, None)
