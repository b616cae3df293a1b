"""Our decode step and generation throughput against transformers', same weights, same threads,
measured interleaved in one run; plus the weight-streaming floor measured on this machine."""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from tqdm import tqdm

from minedraft import LLM, SamplingParams
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.models.llama import Linear


def streaming_bandwidth(num_bytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes per second this process streams through a matrix-vector product much larger than cache."""
    cols = 4096
    w = torch.randn(num_bytes // 4 // cols, cols)
    x = torch.randn(1, w.shape[0])
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        x @ w
        best = min(best, time.perf_counter() - t)
    return w.numel() * 4 / best


def layout_check(model: torch.nn.Module, repeats: int = 5) -> tuple[float, float] | None:
    """Best seconds to push one row through every linear weight of the model: in our [in, out]
    layout (`x @ W`) and in F.linear's [out, in] layout. Why models/llama.py has its own Linear.
    None for a model packed for oneDNN (bfloat16 on CPU), whose weights have neither layout."""
    weights = [m.weight for m in model.modules() if isinstance(m, Linear)]
    if any(w is None for w in weights):
        return None
    transposed = [w.t().contiguous() for w in weights]
    rows = {n: torch.randn(1, n, dtype=weights[0].dtype) for n in {w.shape[0] for w in weights}}

    def best(fn) -> float:
        return min(timed(fn) for _ in range(repeats))

    ours = best(lambda: [rows[w.shape[0]] @ w for w in weights])
    linear = best(lambda: [F.linear(rows[w.shape[0]], t) for w, t in zip(weights, transposed)])
    return ours, linear


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step reads: every linear weight (packed or not) and the norms."""
    linears = sum(m.nbytes for m in model.modules() if isinstance(m, Linear))
    norms = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n.endswith("norm.weight"))
    return linears + norms


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def decode_step_times(runner: ModelRunner, prompts: list[list[int]], steps: int) -> list[float]:
    """Seconds per decode forward (one new token per row) after prefilling `prompts` into free slots."""
    cache = runner.cache
    slots = [cache.allocate() for _ in prompts]
    try:
        runner.forward([Row(s, p) for s, p in zip(slots, prompts)])
        return [timed(lambda: runner.forward([Row(s, [7]) for s in slots])) for _ in range(steps)]
    finally:
        for s in slots:
            cache.free(s)


class Ours:
    name = "minedraft"

    def __init__(self, llm: LLM):
        self.llm = llm
        self.runner = llm.engine.runner

    def step_times(self, prompts: list[list[int]], steps: int) -> list[float]:
        return decode_step_times(self.runner, prompts, steps)

    def generate_time(self, prompts: list[list[int]], output_len: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
        batch = [{"prompt_token_ids": p} for p in prompts]
        return timed(lambda: self.llm.generate(batch, params, use_tqdm=False))


class Transformers:
    name = "transformers"

    def __init__(self, folder, dtype: torch.dtype):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()

    @torch.inference_mode()
    def step_times(self, prompts: list[list[int]], steps: int) -> list[float]:
        from transformers import DynamicCache

        cache = DynamicCache()
        self.model(torch.tensor(prompts), past_key_values=cache, use_cache=True)
        token = torch.full((len(prompts), 1), 7)
        return [timed(lambda: self.model(token, past_key_values=cache, use_cache=True)) for _ in range(steps)]

    @torch.inference_mode()
    def generate_time(self, prompts: list[list[int]], output_len: int) -> float:
        ids = torch.tensor(prompts)
        kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, pad_token_id=0)
        return timed(lambda: self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs))


def run(args: argparse.Namespace) -> dict:
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    max_len = args.context + max(args.output_len, args.steps) + 8
    llm = LLM(args.model, dtype=args.dtype, device=args.device, max_num_seqs=max(batch_sizes), max_model_len=max_len)
    systems = [Ours(llm), Transformers(llm.engine.config.model_path, llm.engine.config.torch_dtype)]
    gen = torch.Generator().manual_seed(0)
    vocab = llm.engine.config.model_args.vocab_size
    prompts = torch.randint(100, vocab, (max(batch_sizes), args.context), generator=gen).tolist()
    step: dict = {}
    tput: dict = {}
    for s in systems:  # warm-up
        s.step_times(prompts[:1], 2)
    with tqdm(total=args.repeats * len(batch_sizes) * len(systems), desc="bench decode") as bar:
        for _ in range(args.repeats):
            for b in batch_sizes:
                for s in systems:
                    step.setdefault((s.name, b), []).append(statistics.median(s.step_times(prompts[:b], args.steps)))
                    elapsed = s.generate_time(prompts[:b], args.output_len)
                    tput.setdefault((s.name, b), []).append(b * args.output_len / elapsed)
                    bar.update()
    bandwidth = streaming_bandwidth()
    model = llm.engine.runner.model
    wbytes = weight_bytes(model)
    floor = wbytes / bandwidth
    layouts = layout_check(model)
    threads = torch.get_num_threads()
    print(f"\nweights {wbytes / 1e6:.0f} MB; streaming bandwidth {bandwidth / 1e9:.1f} GB/s on {threads} thread(s); "
          f"batch-1 floor {floor * 1e3:.1f} ms")
    if layouts is not None:
        print(f"one row through every linear weight: x @ W[in, out] {layouts[0] * 1e3:.1f} ms, "
              f"F.linear with W[out, in] {layouts[1] * 1e3:.1f} ms")
    print("\n| batch | minedraft step ms | transformers step ms | minedraft tok/s | transformers tok/s | tok/s ratio |")
    print("|---|---|---|---|---|---|")
    result = {"threads": threads, "weight_bytes": wbytes, "bandwidth": bandwidth, "floor_s": floor,
              "layout_ours_s": layouts and layouts[0], "layout_f_linear_s": layouts and layouts[1], "rows": []}
    for b in batch_sizes:
        ours_step, hf_step = (statistics.median(step[(n, b)]) for n in ("minedraft", "transformers"))
        ours_tput, hf_tput = (statistics.median(tput[(n, b)]) for n in ("minedraft", "transformers"))
        print(f"| {b} | {ours_step * 1e3:.1f} | {hf_step * 1e3:.1f} | {ours_tput:.1f} | {hf_tput:.1f} | "
              f"{ours_tput / hf_tput:.2f}x |")
        result["rows"].append(dict(batch=b, ours_step_s=ours_step, hf_step_s=hf_step, ours_tok_s=ours_tput,
                                   hf_tok_s=hf_tput))
    b1 = [r for r in result["rows"] if r["batch"] == 1]
    if b1:
        print(f"\nbatch-1 step / floor: {b1[0]['ours_step_s'] / floor:.2f}x")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return result
