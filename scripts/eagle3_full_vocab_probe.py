"""Widen a trained EAGLE-3 head's draft vocabulary to every target token without training.

The head keeps its trained lm_head rows at their target ids; every other row becomes the target's
(tied) input-embedding row times SCALE, the same rows training starts from. The result is a
public-layout head folder that `bench draft --draft-model OUT` runs. It asks whether the tokens a
reduced vocabulary cannot propose (18-28% of the target's output on four Spec-Bench tasks) can be
won back without a retrain (docs/DRAFT_MODEL.md, "A full vocabulary without training").

    .venv/bin/python scripts/eagle3_full_vocab_probe.py OUT --scale 0.5
"""

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from minedraft.models.loader import DEFAULT_DRAFT, read_config, read_embedding, read_safetensors, resolve_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--head", type=Path, default=DEFAULT_DRAFT)
    p.add_argument("--scale", type=float, default=1.0, help="factor on the untrained rows")
    a = p.parse_args()
    tensors = read_safetensors(a.head)
    trained = tensors["lm_head.weight"]
    ids = torch.arange(trained.shape[0]) + tensors["d2t"].long()
    embedding = read_embedding(resolve_model(None)).float()
    rows = embedding * a.scale
    rows[ids] = trained.float()
    vocab = rows.shape[0]
    tensors["lm_head.weight"] = rows.to(trained.dtype)
    tensors["d2t"] = torch.zeros(vocab, dtype=tensors["d2t"].dtype)
    tensors["t2d"] = torch.ones(vocab, dtype=torch.bool)
    print(f"{len(ids)} trained rows (median norm {trained.float().norm(dim=1).median():.2f}), "
          f"{vocab - len(ids)} new rows (median norm {rows.norm(dim=1).median():.2f})")
    a.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, a.out / "model.safetensors")
    config = read_config(a.head)
    config["draft_vocab_size"] = vocab
    (a.out / "config.json").write_text(json.dumps(config, indent=2))


if __name__ == "__main__":
    main()
