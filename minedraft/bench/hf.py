"""The peer in `bench offline --modes hf`: transformers' assisted generation at batch 1 with the
same model pair (or transformers' prompt lookup for the n-gram method), timed request by request."""

import time
from pathlib import Path

import torch

from minedraft.bench.stats import request_figures
from minedraft.config import SpeculativeConfig
from minedraft.models.draft_format import full_vocabulary, is_draft_checkpoint
from minedraft.models.loader import read_config, read_embedding, read_safetensors
from minedraft.sampling import SamplingParams


def assistant_model(draft_dir: Path, target_dir: Path, dtype: torch.dtype):
    """A transformers Llama for a draft checkpoint. A drafter made by `minedraft train-draft` (the
    target's embedding, a reduced head) becomes a full-vocabulary model: its head rows go to its
    tokens and every other token gets a zero row. Ours never drafts those tokens (probability 0), so
    the two drafters differ only where every draft-vocabulary logit is negative."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    cfg = read_config(draft_dir)
    if not is_draft_checkpoint(cfg):
        return AutoModelForCausalLM.from_pretrained(draft_dir, dtype=dtype).eval()
    cfg, tensors = full_vocabulary(cfg, read_safetensors(draft_dir), read_embedding(target_dir), dtype)
    model = LlamaForCausalLM(LlamaConfig(**{**cfg, "tie_word_embeddings": False})).to(dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=True)
    return model.eval()


class FirstToken:
    """A transformers streamer that notes when the first generated tokens arrive (put() is called
    once with the prompt, then with every batch of accepted tokens)."""

    def __init__(self):
        self.calls, self.time = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.time = time.perf_counter()

    def end(self) -> None:
        pass


class AssistedGeneration:
    """transformers' target with our pair's drafter as its assistant (or its prompt lookup)."""

    def __init__(self, target_dir: Path, spec: SpeculativeConfig, dtype: torch.dtype):
        from transformers import AutoModelForCausalLM

        self.target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).eval()
        self.spec = spec
        self.assistant = None if spec.method == "ngram" else assistant_model(spec.model_path, target_dir, dtype)

    @torch.inference_mode()
    def run(self, prompts: list[list[int]], k: int | str, params: SamplingParams) -> dict:
        """Each prompt alone, one after the other; figures shaped like bench offline's."""
        kwargs = dict(max_new_tokens=params.max_tokens, pad_token_id=self.target.config.eos_token_id)
        if params.ignore_eos:
            kwargs["min_new_tokens"] = params.max_tokens
        if params.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(do_sample=True, temperature=params.temperature, top_k=0, top_p=1.0)
        if self.assistant is None:  # k = "auto": transformers' default lookup length
            kwargs.update(prompt_lookup_num_tokens=10 if k == "auto" else k,
                          max_matching_ngram_size=self.spec.prompt_lookup_max)
        elif k == "auto":  # transformers' own adaptive schedule and confidence cut-off
            kwargs.update(assistant_model=self.assistant)
        else:  # exactly k drafts per round, as in our engine (no confidence cut-off, no schedule)
            kwargs.update(assistant_model=self.assistant, num_assistant_tokens=k,
                          num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        e2e, ttft, tokens, outputs = [], [], [], {}
        start = time.perf_counter()
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([prompt])
            first, began = FirstToken(), time.perf_counter()
            out = self.target.generate(ids, attention_mask=torch.ones_like(ids), streamer=first, **kwargs)
            e2e.append(time.perf_counter() - began)
            ttft.append((first.time or time.perf_counter()) - began)
            outputs[i] = out[0, len(prompt):].tolist()
            tokens.append(len(outputs[i]))
        makespan = time.perf_counter() - start
        return {
            **request_figures(e2e, ttft, tokens, makespan),
            "acceptance_rate": None, "mean_acceptance_length": None, "mean_draft_length": None, "overlapped_share": None,
            "verify_s_median": None, "draft_s_median": None, "target_idle_share": None, "drafter_idle_share": None,
            "makespan_s": makespan, "outputs": outputs, "trace": [],
        }
