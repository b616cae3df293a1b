import pytest
import torch

from minedraft.kv_cache import KVCache


def test_slots_allocate_free_and_truncate():
    cache = KVCache(2, 3, 16, 1, 4, torch.float32, torch.device("cpu"))
    slots = [cache.allocate() for _ in range(3)]
    assert slots == [0, 1, 2] and cache.num_free == 0
    with pytest.raises(RuntimeError, match="no free"):
        cache.allocate()
    cache.lengths[1] = 10
    cache.truncate(1, 7)
    assert cache.lengths[1] == 7
    with pytest.raises(ValueError):
        cache.truncate(1, 8)
    cache.free(1)
    with pytest.raises(RuntimeError, match="twice"):
        cache.free(1)
    assert cache.allocate() == 1 and cache.lengths[1] == 0
