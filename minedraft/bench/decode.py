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
from minedraft.kernels import small_gemm
from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.models.llama import Linear


def streaming_bandwidth(device: torch.device, num_bytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes per second this process reads from `device`'s memory: the best of `repeats` sums over a
    tensor far larger than cache. A sum does nothing but read (an MKL matrix-vector product, which
    this measured before, read 22-25 GB/s where the small-row kernel's products reached 30 GB/s), so
    the floor it gives is one no decode step can beat."""
    a = torch.ones(num_bytes // 4, device=device)
    return a.numel() * 4 / min(timed(a.sum) for _ in range(repeats))


def layout_check(model: torch.nn.Module, repeats: int = 5) -> dict[str, float]:
    """Best seconds to push rows through every linear weight of the model, per layout: one row in
    our [in, out] layout (`x @ W`) and in F.linear's [out, in] one (why models/llama.py has its own
    Linear), and eight rows in [in, out], through oneDNN's packed weight and through the small-row
    kernel's panels (why float32 keeps them all). Only the layouts the loaded model has: a bfloat16
    model packed on CPU without the bfloat16 kernel has neither dense one nor panels."""
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    dense = [m.weight for m in linears if m.weight is not None]
    packed = [m for m in linears if m.packed is not None]
    small = [m for m in linears if m.small is not None]

    def best(rows: int, product) -> float:
        xs = {m.in_features: torch.randn(rows, m.in_features, dtype=model.norm.weight.dtype) for m in linears}
        return min(timed(lambda: product(xs)) for _ in range(repeats))

    out = {}
    if dense:
        transposed = [w.t().contiguous() for w in dense]
        out["x @ W[in, out], 1 row"] = best(1, lambda xs: [xs[w.shape[0]] @ w for w in dense])
        out["F.linear with W[out, in], 1 row"] = best(
            1, lambda xs: [F.linear(xs[w.shape[0]], t) for w, t in zip(dense, transposed)])
        out["x @ W[in, out], 8 rows"] = best(8, lambda xs: [xs[w.shape[0]] @ w for w in dense])
    if packed:
        out["oneDNN packed, 8 rows"] = best(8, lambda xs: [torch.ops.mkldnn._linear_pointwise(
            xs[m.in_features], m.packed, m.bias, "none", [], "") for m in packed])
    if small:
        out["small-row kernel, 8 rows"] = best(8, lambda xs: [small_gemm.linear(xs[m.in_features], m.small, m.bias)
                                                             for m in small])
    return out


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step reads: every linear weight (packed or not) and the norms."""
    linears = sum(m.nbytes for m in model.modules() if isinstance(m, Linear))
    norms = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n.endswith("norm.weight"))
    return linears + norms


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of weights the model keeps in memory: every parameter, plus the packed copies of each
    linear weight that has them (float32 on CPU keeps the dense one, oneDNN's and the kernel's;
    bfloat16 the same where the CPU has AVX512-BF16; block codes where the weights have them)."""
    copies = []
    for m in model.modules():
        if isinstance(m, Linear):
            copies += [m.packed] + ([] if m.small is None else [m.small.panels, *(m.small.codes or ())])
    copies = [t for t in copies if t is not None]
    return sum(t.numel() * t.element_size() for t in copies) + sum(p.numel() * p.element_size()
                                                                   for p in model.parameters())


def timed(fn) -> float:
    """Seconds `fn` takes, its GPU work included."""
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else (lambda: None)
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def decode_step_times(runner: ModelRunner, prompts: list[list[int]], steps: int, tokens: int = 1,
                      chunk: int = 0) -> list[float]:
    """Seconds per forward of `tokens` new tokens per row, all scored (1: a decode step; k + 1: a
    verification), after prefilling `prompts` into free slots; each step starts from the prompt.
    `chunk`: the first `chunk` tokens of a new prompt ride with each step in one more slot (a
    served step beside a prompt being prefilled)."""
    cache = runner.cache
    slots = [cache.allocate() for _ in prompts]
    chunk_slot = cache.allocate() if chunk else None
    try:
        runner.forward([Row(s, p) for s, p in zip(slots, prompts)])
        extra = [Row(chunk_slot, [9] * chunk, 0)] if chunk else []

        def step() -> float:
            elapsed = timed(lambda: runner.forward([Row(s, [7] * tokens, tokens) for s in slots] + extra))
            for s, p in zip(slots, prompts):
                cache.truncate(s, len(p))
            if chunk:
                cache.truncate(chunk_slot, 0)
            return elapsed

        return [step() for _ in range(steps)]
    finally:
        for s in slots + ([chunk_slot] if chunk else []):
            cache.free(s)


class Ours:
    name = "minedraft"

    def __init__(self, llm: LLM):
        self.llm = llm
        self.runner = llm.engine.runner

    def step_times(self, prompts: list[list[int]], steps: int) -> list[float]:
        return decode_step_times(self.runner, prompts, steps)

    def verify_times(self, prompts: list[list[int]], steps: int, tokens: int) -> list[float]:
        return decode_step_times(self.runner, prompts, steps, tokens)

    def generate_time(self, prompts: list[list[int]], output_len: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
        batch = [{"prompt_token_ids": p} for p in prompts]
        return timed(lambda: self.llm.generate(batch, params, use_tqdm=False))


class Transformers:
    name = "transformers"

    def __init__(self, folder, dtype: torch.dtype, device: torch.device):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
        self.device = device

    @torch.inference_mode()
    def step_times(self, prompts: list[list[int]], steps: int) -> list[float]:
        from transformers import DynamicCache

        cache = DynamicCache()
        self.model(torch.tensor(prompts, device=self.device), past_key_values=cache, use_cache=True)
        token = torch.full((len(prompts), 1), 7, device=self.device)
        return [timed(lambda: self.model(token, past_key_values=cache, use_cache=True)) for _ in range(steps)]

    @torch.inference_mode()
    def generate_time(self, prompts: list[list[int]], output_len: int) -> float:
        ids = torch.tensor(prompts, device=self.device)
        kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, pad_token_id=0)
        return timed(lambda: self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs))


def run(args: argparse.Namespace) -> dict:
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.output_len < 2:
        raise ValueError(f"--output-len must be >= 2 (decode-phase throughput subtracts a one-token run), "
                         f"got {args.output_len}")
    max_len = args.context + max(args.output_len, args.steps) + 8
    llm = LLM(args.model, dtype=args.dtype, device=args.device, max_num_seqs=max(batch_sizes), max_model_len=max_len,
              enforce_eager=args.enforce_eager)
    device = llm.engine.runner.device
    systems = [Ours(llm), Transformers(llm.engine.config.model_path, llm.engine.config.torch_dtype, device)]
    gen = torch.Generator().manual_seed(0)
    vocab = llm.engine.config.model_args.vocab_size
    prompts = torch.randint(100, vocab, (max(batch_sizes), args.context), generator=gen).tolist()
    tables = measure(systems, prompts, batch_sizes, args)
    result = {**machine_figures(llm.engine.runner.model), "verify_tokens": args.verify_tokens,
              "compiled": not args.enforce_eager, "rows": []}
    for b in batch_sizes:
        row = {"batch": b}
        for key, table in tables.items():
            for who, name in (("ours", "minedraft"), ("hf", "transformers")):
                if (name, b) in table:
                    row[f"{who}_{key}"] = statistics.median(table[(name, b)])
        result["rows"].append(row)
    print_report(result)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    return result


def measure(systems: list, prompts: list[list[int]], batch_sizes: list[int],
            args: argparse.Namespace) -> dict[str, dict[tuple[str, int], list[float]]]:
    """Per figure (step_s, tok_s, decode_tok_s), every run's value by (system, batch size); the
    systems interleaved, `args.repeats` times."""
    tables: dict[str, dict] = {"step_s": {}, "tok_s": {}, "decode_tok_s": {}, "verify_s": {}}
    for s in systems:  # warm-up
        s.step_times(prompts[:1], 2)
    with tqdm(total=args.repeats * len(batch_sizes) * len(systems), desc="bench decode") as bar:
        for _ in range(args.repeats):
            for b in batch_sizes:
                for s in systems:
                    key = (s.name, b)
                    step_s = statistics.median(s.step_times(prompts[:b], args.steps))
                    tables["step_s"].setdefault(key, []).append(step_s)
                    if hasattr(s, "verify_times"):  # ours only: what a verification costs
                        verify_s = statistics.median(s.verify_times(prompts[:b], args.steps, args.verify_tokens))
                        tables["verify_s"].setdefault(key, []).append(verify_s)
                    elapsed = s.generate_time(prompts[:b], args.output_len)
                    tables["tok_s"].setdefault(key, []).append(b * args.output_len / elapsed)
                    # Generation throughput over the decode phase (the paper's figure): a one-token
                    # run is the prefill and the first token; the rest of the N-token run is decoding.
                    first = s.generate_time(prompts[:b], 1)
                    tables["decode_tok_s"].setdefault(key, []).append(b * (args.output_len - 1) / (elapsed - first))
                    bar.update()
    return tables


def machine_figures(model: torch.nn.Module) -> dict:
    """What bounds a decode step here: the bytes it reads, the streaming bandwidth, their ratio
    (the batch-1 floor) and the time through every linear weight per layout."""
    device = model.norm.weight.device
    bandwidth = streaming_bandwidth(device)
    wbytes = weight_bytes(model)
    return {"device": str(device), "threads": torch.get_num_threads(), "weight_bytes": wbytes,
            "held_bytes": held_bytes(model), "bandwidth": bandwidth, "floor_s": wbytes / bandwidth,
            "layouts_s": layout_check(model) if device.type == "cpu" else {}}


def print_report(result: dict) -> None:
    floor, layouts = result["floor_s"], result["layouts_s"]
    print(f"\nweights read per step {result['weight_bytes'] / 1e6:.0f} MB, held {result['held_bytes'] / 1e6:.0f} MB; "
          f"streaming bandwidth {result['bandwidth'] / 1e9:.1f} GB/s ({result['device']}, {result['threads']} "
          f"CPU thread(s)); "
          f"batch-1 floor {floor * 1e3:.1f} ms")
    if layouts:
        print("through every linear weight: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in layouts.items()))
    print("\n| batch | minedraft step ms | transformers step ms | minedraft tok/s | transformers tok/s | ratio "
          "| minedraft decode tok/s | transformers decode tok/s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in result["rows"]:
        print(f"| {row['batch']} | {row['ours_step_s'] * 1e3:.1f} | {row['hf_step_s'] * 1e3:.1f} | "
              f"{row['ours_tok_s']:.1f} | {row['hf_tok_s']:.1f} | {row['ours_tok_s'] / row['hf_tok_s']:.2f}x | "
              f"{row['ours_decode_tok_s']:.1f} | {row['hf_decode_tok_s']:.1f} | "
              f"{row['ours_decode_tok_s'] / row['hf_decode_tok_s']:.2f}x |")
    for row in result["rows"]:
        print(f"batch {row['batch']}: verifying {result['verify_tokens']} tokens per row "
              f"{row['ours_verify_s'] * 1e3:.1f} ms = {row['ours_verify_s'] / row['ours_step_s']:.2f}x a decode step")
    b1 = [r for r in result["rows"] if r["batch"] == 1]
    if b1:
        print(f"\nbatch-1 step / floor: {b1[0]['ours_step_s'] / floor:.2f}x")
