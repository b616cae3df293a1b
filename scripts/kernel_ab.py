"""Two or more versions of one C++ kernel (`small_gemm.cpp` or `attention.cpp`) in one process,
timed interleaved, medians: what a change to a kernel does, free of the drift between runs
(this 2-vCPU machine's bandwidth moved by 20% within minutes on 2026-12-03).

Each version is built under its own operator namespace. The work is what a forward pass of
SmolLM2-135M gives the kernel, its data streaming from memory as there:
- small_gemm: the 121 products of a forward pass of ROWS rows (30 layers' qkv, o, gate_up and
  down, each layer its own weights, then the lm_head);
- attention: one call per layer for 30 layers' caches, BATCH rows of TOKENS new tokens after
  CONTEXT cached ones.

    git show HEAD~1:minedraft/kernels/small_gemm.cpp > /tmp/old.cpp
    taskset -c 0 .venv/bin/python scripts/kernel_ab.py small_gemm /tmp/old.cpp minedraft/kernels/small_gemm.cpp \\
        --rows 8,40
    taskset -c 0 .venv/bin/python scripts/kernel_ab.py attention OLD.cpp NEW.cpp --batch 8 --tokens 1,5 --context 512
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from minedraft.kernels import small_gemm

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 30, 576, 9, 3, 64, 49152
SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)]  # qkv, o, gate_up, down


def build(source: Path, tag: str, folder: Path):
    """The kernel in `source` as torch.ops.<tag>."""
    text = source.read_text()
    for macro in ("TORCH_LIBRARY", "TORCH_LIBRARY_FRAGMENT", "TORCH_LIBRARY_IMPL"):
        text = text.replace(f"{macro}(minedraft_kernels,", f"{macro}({tag},")
    path = folder / tag / "kernel.cpp"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    load(name=tag, sources=[str(path)], extra_cflags=["-O3", "-march=native"], build_directory=str(path.parent),
         is_python_module=False)
    return getattr(torch.ops, tag)


def gemm_work(rows: int):
    """A forward pass's products of `rows` rows, for a kernel namespace."""
    layers = [[small_gemm.pack(torch.randn(k, n) * 0.02) for k, n in SHAPES] for _ in range(LAYERS)]
    layers.append([small_gemm.pack(torch.randn(HIDDEN, VOCAB) * 0.02)])
    inputs = {k: torch.randn(rows, k) for k, _ in SHAPES}

    def work(ops) -> torch.Tensor:
        for layer in layers:
            for packed in layer:
                y = ops.small_gemm(inputs[packed.dense.shape[0]], packed.panels, packed.dense.shape[1], None)
        return y
    return work


def attention_work(batch: int, tokens: int, context: int):
    """One step's attention calls, layer after layer, for a kernel namespace."""
    shape = (LAYERS, batch, KV_HEADS, context + tokens, HEAD_DIM)
    k_cache, v_cache = torch.randn(shape), torch.randn(shape)
    q = torch.randn(batch * tokens, HEADS, HEAD_DIM)
    k, v = torch.randn(batch * tokens, KV_HEADS, HEAD_DIM), torch.randn(batch * tokens, KV_HEADS, HEAD_DIM)
    rows = torch.tensor([[b, context, tokens] for b in range(batch)])

    def work(ops) -> torch.Tensor:
        for layer in range(LAYERS):
            out = ops.cached_attention(q, k, v, k_cache[layer], v_cache[layer], rows)
        return out
    return work


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kernel", choices=["small_gemm", "attention"])
    p.add_argument("sources", nargs="+", type=Path, help="versions of the kernel's .cpp file")
    p.add_argument("--rows", default="8,40", help="small_gemm: rows per product")
    p.add_argument("--batch", type=int, default=8, help="attention: rows")
    p.add_argument("--tokens", default="1,5", help="attention: new tokens per row")
    p.add_argument("--context", type=int, default=512, help="attention: cached tokens per row")
    p.add_argument("--repeats", type=int, default=12)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        versions = [(f"{i}:{s}", build(s, f"ab{i}", Path(folder))) for i, s in enumerate(args.sources)]
        if args.kernel == "small_gemm":
            assert small_gemm.build(), "the packing needs the project's own kernel"
            cases = {f"{r} rows": gemm_work(int(r)) for r in args.rows.split(",")}
        else:
            cases = {f"{args.batch} x {t} tokens after {args.context}": attention_work(args.batch, int(t), args.context)
                     for t in args.tokens.split(",")}
        for case, work in cases.items():
            times = {name: [] for name, _ in versions}
            outputs = {name: work(ops) for name, ops in versions}  # also a warm-up
            for _ in range(args.repeats):
                for name, ops in versions:
                    start = time.perf_counter()
                    work(ops)
                    times[name].append(time.perf_counter() - start)
            first = versions[0][0]
            for name, _ in versions:
                ms = statistics.median(times[name]) * 1e3
                ratio = ms / (statistics.median(times[first]) * 1e3)
                same = torch.equal(outputs[name], outputs[first])
                print(f"{case}: {name} {ms:.2f} ms ({ratio:.3f}x the first; same bits: {same})", flush=True)


if __name__ == "__main__":
    main()
