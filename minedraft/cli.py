"""`minedraft generate | serve | bench ... | derive-draft | train-draft | vllm-args`: the command line."""

import argparse
import json
import sys


def add_engine_args(parser: argparse.ArgumentParser, eager: bool = False) -> None:
    parser.add_argument("--model", default=None, help="checkpoint folder or .gguf file (default: bundled SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    parser.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens per request")
    parser.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    add_eager_arg(parser, eager)


def add_eager_arg(parser: argparse.ArgumentParser, default: bool = False) -> None:
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=default,
                        help="never compile the forward pass on CPU (starts in seconds rather than about a "
                             "minute with graphs cached, several the first time; decodes slower) nor replay "
                             "CUDA graphs on a GPU")


def add_prefill_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="prompt tokens a step may carry (default 512 on CPU, 2048 on GPU)")
    parser.add_argument("--max-prompt-tokens-beside-streams", type=int, default=None,
                        help="at most this many while prefilled streams run in the step "
                             "(default: --max-num-batched-tokens)")
    parser.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                        help="split prompts over steps (default); without, a prompt runs whole")
    parser.add_argument("--prefill-stall-ratio", type=_stall_ratio, default="auto",
                        help="beside running streams, prompt chunks shrink so that a step takes at most this many "
                             "times a step without them; none: the full budget (default auto: 2.5 for serve on CPU, "
                             "else none)")
    parser.add_argument("--scheduling-policy", choices=["fcfs", "shortest_prompt"], default=None,
                        help="which prompts a step's prompt tokens go to: in arrival order, or the soonest done "
                             "first, none passing a prompt that waited its own prefill time (default: "
                             "shortest_prompt for serve, fcfs elsewhere)")


def _stall_ratio(text: str) -> float | str | None:
    """--prefill-stall-ratio: a number, auto or none (EngineConfig checks the number)."""
    word = text.lower()
    if word in ("auto", "none"):
        return None if word == "none" else word
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, auto or none, got {text!r}") from None


def add_speculative_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speculative-config", default=None,
                        help='JSON, e.g. \'{"model": "self", "num_speculative_tokens": 4, "parallel": true}\'')


def speculative_config(text: str | None) -> dict | None:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--speculative-config is not valid JSON: {e}") from None


def cmd_generate(args: argparse.Namespace) -> None:
    from minedraft import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
              num_threads=args.num_threads, max_num_seqs=1, enforce_eager=args.enforce_eager,
              speculative_config=speculative_config(args.speculative_config))
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed)
    if args.chat:
        out = llm.chat([{"role": "user", "content": args.prompt}], params, use_tqdm=False)
    else:
        out = llm.generate([args.prompt], params, use_tqdm=False)
    print(out[0].outputs[0].text)
    if args.stats:
        for key, value in llm.get_metrics().items():
            print(f"{key}: {value}", file=sys.stderr)


def cmd_serve(args: argparse.Namespace) -> None:
    from minedraft.server import serve

    args.speculative_config = speculative_config(args.speculative_config)
    serve(args)


def cmd_bench_decode(args: argparse.Namespace) -> None:
    from minedraft.bench.decode import run

    run(args)


def cmd_bench_offline(args: argparse.Namespace) -> None:
    from minedraft.bench.offline import run

    run(args)


def cmd_bench_serve(args: argparse.Namespace) -> None:
    from minedraft.bench.serve import run

    run(args)


def cmd_bench_draft(args: argparse.Namespace) -> None:
    from minedraft.bench.draft import run

    args.speculative_config = speculative_config(args.speculative_config)
    run(args)


def cmd_bench_llamacpp(args: argparse.Namespace) -> None:
    from minedraft.bench.llamacpp import run

    run(args)


def cmd_derive_draft(args: argparse.Namespace) -> None:
    from pathlib import Path

    from minedraft.models.loader import derive_truncated, resolve_model

    out = derive_truncated(resolve_model(args.model), args.layers, Path(args.out))
    print(f"wrote a {args.layers}-layer draft checkpoint to {out}")


def cmd_train_draft(args: argparse.Namespace) -> None:
    from minedraft.training.train_draft import run

    run(args)


def add_generate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="complete one prompt and print the completion")
    add_engine_args(p, eager=True)  # one prompt: compiling would cost more than it saves
    add_speculative_arg(p)
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stats", action="store_true", help="print speculative-decoding metrics to stderr")
    p.set_defaults(func=cmd_generate)


def add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    add_engine_args(p)
    add_prefill_args(p)
    add_speculative_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/ routes")
    p.add_argument("--max-num-seqs", type=int, default=16, help="requests in flight")
    p.add_argument("--max-queue", type=int, default=256, help="waiting requests before answering 503")
    p.add_argument("--served-model-name", default=None, help="the model id clients use (default: folder name)")
    p.add_argument("--trace", default=None, help="append every engine step to this JSON-lines file as it ends")
    p.add_argument("--shutdown-grace-s", type=float, default=5.0,
                   help="on SIGTERM or Ctrl-C, seconds the running requests may go on before they are ended "
                        "(finish reason abort; a stream's final chunk, then [DONE]); a second Ctrl-C stops at once")
    p.set_defaults(func=cmd_serve)


def add_bench_decode(bench: argparse._SubParsersAction) -> None:
    p = bench.add_parser("decode", help="decode step time and throughput against transformers")
    add_engine_args(p)
    p.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes")
    p.add_argument("--context", type=int, default=128, help="prompt tokens before decoding")
    p.add_argument("--output-len", type=int, default=64, help="tokens generated per request")
    p.add_argument("--steps", type=int, default=20, help="decode steps timed per repeat")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions; medians are reported")
    p.add_argument("--output-json", default=None, help="write every figure to this file")
    p.add_argument("--verify-tokens", type=int, default=5, help="tokens per row in the timed verification (k + 1)")
    p.set_defaults(func=cmd_bench_decode)


def add_bench_offline(bench: argparse._SubParsersAction) -> None:
    p = bench.add_parser("offline", help="ar / sd / psd throughput and latency, interleaved in one run")
    p.add_argument("--model", default=None, help="target (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    p.add_argument("--draft-model", default=None, help="draft checkpoint folder or 'self' (default: the bundled drafter)")
    p.add_argument("--speculative-config", default=None,
                     help='JSON every speculative mode shares, e.g. \'{"method": "ngram"}\' (placement and k come '
                          'from --modes and --num-speculative-tokens)')
    p.add_argument("--modes", default="ar,sd,sd-remote,psd,sd-2t",
                     help="comma-separated: ar,sd,sd-remote,psd,sd-2t,sd-tetris,psd-tetris,hf (-tetris: with TETRIS "
                          "selection; hf: transformers' assisted generation)")
    p.add_argument("--num-speculative-tokens", default="1,2,3,4,5", help="comma-separated k values")
    p.add_argument("--concurrency", default="8,16", help="comma-separated numbers of requests in flight")
    p.add_argument("--dataset", default=None, help="Spec-Bench / prompt jsonl, ShareGPT json or text; default: built-in")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--ignore-eos", action="store_true", help="always generate --output-len tokens")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=1, help="interleaved repetitions; medians are reported")
    add_eager_arg(p)
    add_prefill_args(p)
    p.add_argument("--output-json", default=None)
    p.add_argument("--plot-dir", default=None,
                     help="write PNGs here: throughput against k, latency CDF, psd and sd-remote timelines")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_bench_offline)


def add_bench_serve(bench: argparse._SubParsersAction) -> None:
    p = bench.add_parser("serve", help="load an OpenAI-compatible server with streamed chat requests")
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--served-model", default=None, help="model id (default: the server's first)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset", default=None, help="Spec-Bench / prompt jsonl, ShareGPT json or text; default: built-in")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson arrivals per second (inf: all at once)")
    p.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most (closed loop)")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", default=None)
    p.add_argument("--goodput", nargs="+", default=None, metavar="KEY:VALUE",
                   help="an SLO, as vLLM's: KEY ttft, tpot or e2el, VALUE milliseconds, e.g. ttft:2000 tpot:300; "
                        "goodput: completed requests per second meeting every bound")
    p.add_argument("--plot-itl", default=None, metavar="PATH.png",
                   help="write a PNG of every inter-token gap over the run")
    p.add_argument("--label", default=None, help="the run's name in the plot (default: from the request rate)")
    p.set_defaults(func=cmd_bench_serve)


def add_bench_draft(bench: argparse._SubParsersAction) -> None:
    p = bench.add_parser("draft", help="a drafter's acceptance per Spec-Bench task and its cost ratio c")
    p.add_argument("--model", default=None, help="target (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--method", default=None, choices=["draft_model", "eagle3", "ngram"],
                     help="default: inferred from the draft checkpoint")
    p.add_argument("--draft-model", default=None,
                     help="draft checkpoint folder (a draft model or an EAGLE-3 head) or 'self' (default: the bundled drafter)")
    p.add_argument("--speculative-config", default=None,
                     help='JSON of further speculative_config keys, e.g. \'{"prompt_lookup_first": false}\'')
    p.add_argument("--dataset", default="../shared/data/spec_bench_questions.jsonl", help="Spec-Bench questions jsonl")
    p.add_argument("--per-task", type=int, default=20, help="prompts per Spec-Bench task")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--temperatures", default="0,1", help="comma-separated; 0 is greedy")
    p.add_argument("--max-num-seqs", type=int, default=16, help="requests in flight while measuring acceptance")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--batch-sizes", default="1,8", help="batch sizes for the cost ratio")
    p.add_argument("--context", type=int, default=128, help="cached tokens per row when timing steps")
    p.add_argument("--steps", type=int, default=20, help="decode steps timed per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", default=None)
    p.set_defaults(func=cmd_bench_draft)


def add_bench_llamacpp(bench: argparse._SubParsersAction) -> None:
    p = bench.add_parser("llamacpp", help="llama.cpp's own tools and MineDraft side by side on one GGUF file "
                                          "(builds llama.cpp once)")
    p.add_argument("--model", default=None, help=".gguf file (default: bundled SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (cores 0..N-1 for both)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions; medians are reported")
    p.add_argument("--output-len", type=int, default=128, help="tokens generated per sequence")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per sequence at batch 8")
    add_eager_arg(p)
    p.set_defaults(func=cmd_bench_llamacpp)


def add_derive_draft(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("derive-draft", help="write a draft checkpoint made of a target's first layers")
    p.add_argument("--model", default=None, help="target (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=cmd_derive_draft)


def cmd_vllm_args(args: argparse.Namespace) -> None:
    import shlex

    from minedraft.vllm import serve_command, serve_flags

    kwargs = dict(num_speculative_tokens=args.num_speculative_tokens, draft_device=args.draft_device,
                  draft_cpus=args.draft_cpus, parallel=not args.sequential, trace=args.trace)
    if args.draft_model is not None:
        kwargs["draft_model"] = args.draft_model
    print(serve_command(args.model, **kwargs) if args.model else shlex.join(serve_flags(**kwargs)))


def add_vllm_args(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vllm-args", help="the `vllm serve` flags that run PSD through MineDraft's vLLM plugin")
    p.add_argument("--model", default=None, help="target: print a whole `vllm serve MODEL ...` command")
    p.add_argument("--draft-model", default=None, help="draft checkpoint folder (default: the bundled draft model)")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--draft-device", default="cpu", help="the drafter's torch device, e.g. cpu or cuda:1")
    p.add_argument("--draft-cpus", type=lambda v: [int(c) for c in v.split(",")], default=None,
                   help="cores the drafter process is pinned to, e.g. 1 or 6,7")
    p.add_argument("--sequential", action="store_true", help="draft then verify every request (no overlap)")
    p.add_argument("--trace", default=None, help="write every step to this JSON-lines file")
    p.set_defaults(func=cmd_vllm_args)


def add_train_draft(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train-draft",
                       help="train a drafter for a target: a small draft model or an EAGLE-3 head (resumable)")
    p.add_argument("--model", default=None, help="target (default: bundled SmolLM2-135M-Instruct)")
    p.add_argument("--out", required=True, help="work folder: data shards, checkpoints, log.jsonl")
    p.add_argument("--export", default=None, help="where to write the drafter (default: OUT/model)")
    p.add_argument("--num-prompts", type=int, default=512, help="training prompts the target answers (slow: it generates)")
    p.add_argument("--num-texts", type=int, default=2560, help="documentation continuations the target scores (fast)")
    p.add_argument("--shard-size", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=192, help="longest reply recorded")
    p.add_argument("--top-k", type=int, default=20, help="target log-probabilities kept per position")
    p.add_argument("--max-num-seqs", type=int, default=64, help="replies generated at once")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--init-layers", default="0,1,2,3", help="target layers the drafter starts from")
    p.add_argument("--init-from", default=None,
                   help="continue from a drafter this command exported, or (eagle3) an EAGLE-3 head in the "
                        "public layout: its weights, and its vocabulary unless --vocab-size names another size")
    p.add_argument("--prompt-mix", default="default", choices=["default", "spec_bench", "written"],
                   help="training prompt families: the original six; with families shaped like Spec-Bench's tasks; "
                        "or (written) summarising and answering from articles the target writes first")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="the target's dtype while it generates and scores the data")
    p.add_argument("--autocast-bf16", action="store_true", help="train under bfloat16 autocast (faster on AMX CPUs)")
    p.add_argument("--vocab-size", type=int, default=8192, help="draft head size: most frequent reply tokens")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per optimiser step")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--method", default="draft_model", choices=["draft_model", "eagle3"],
                   help="a small draft model, or an EAGLE-3 head over the target's hidden states")
    p.add_argument("--ttt-steps", type=int, default=4, help="eagle3: draft steps unrolled in training")
    p.add_argument("--prompt-loss-weight", type=float, default=0.0,
                   help="eagle3: loss weight of prompt positions (reply positions: 1); the target's "
                        "distribution along the prompt is a label too")
    p.add_argument("--max-minutes", type=float, default=None, help="eagle3: stop (checkpointed) after this long")
    p.set_defaults(func=cmd_train_draft)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="minedraft", description="MineDraft: batch parallel speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate(sub)
    add_serve(sub)
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    for add in (add_bench_decode, add_bench_offline, add_bench_serve, add_bench_draft, add_bench_llamacpp):
        add(bench)
    add_derive_draft(sub)
    add_train_draft(sub)
    add_vllm_args(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
