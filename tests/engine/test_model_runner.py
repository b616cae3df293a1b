import torch

from minedraft.engine.model_runner import ModelRunner, Row
from minedraft.models.loader import load_model

CPU = torch.device("cpu")


def test_evenly_spaced_slots_attend_in_one_call_with_the_same_logits(tiny_llama):
    model = load_model(tiny_llama, torch.float64, CPU)
    runner = ModelRunner(model, 6, 64, torch.float64, CPU)
    prompts = {0: [5, 17, 3, 44], 2: [8, 9, 10, 11], 4: [90, 12, 33, 1]}  # psd's every-other-slot start
    runner.forward([Row(s, p) for s, p in prompts.items()])
    rows = [Row(s, [7, 2], 2) for s in prompts]
    layout = runner.prepare(rows)[0]
    assert layout.rows == slice(0, 6, 2) and layout.per_row is None  # a strided view, one call
    batched = runner.forward(rows)
    for s in prompts:
        runner.cache.truncate(s, 4)
    alone = torch.cat([runner.forward([row]) for row in rows])
    torch.testing.assert_close(batched, alone, rtol=1e-12, atol=1e-12)
    assert runner.prepare([Row(0, [1]), Row(1, [1]), Row(4, [1])])[0].rows is None  # uneven: one call each
