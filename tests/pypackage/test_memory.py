"""The storage cache behind posembed's outputs and fresh gradients (src/python/memory.h).

Storage that torch frees waits in the cache and the next request of its size class takes it
back; past a byte limit the longest-waiting blocks go. Checked through the cache's counters and
the tensors' addresses, and, for the module, through the process's page faults.
"""

import resource

import pytest
import torch

from posembed import _C
from posembed.errors import InvalidInputError
from posembed.torch import LearnedPositionEmbedding

MiB = 1 << 20


@pytest.fixture(autouse=True)
def fresh_cache():
    """An empty cache with the default limit, before and after each test."""
    _C.empty_cache()
    limit = _C.cache_stats()["limit_bytes"]
    yield
    _C.set_cache_limit(limit)
    _C.empty_cache()


def floats(mib):
    """(rows, cols) of a float32 tensor of `mib` MiB."""
    return mib * MiB // 4096, 1024


def test_a_freed_block_is_taken_back_by_its_size():
    t = _C.empty(floats(4), "float32")
    address = t.data_ptr()
    del t
    before = _C.cache_stats()
    assert before["cached_blocks"] == 1 and before["cached_bytes"] == 4 * MiB
    again = _C.empty(floats(4), "float32")
    after = _C.cache_stats()
    assert again.data_ptr() == address
    assert after["hits"] == before["hits"] + 1 and after["misses"] == before["misses"]
    assert after["cached_blocks"] == 0


def test_a_smaller_request_does_not_take_a_much_larger_block():
    big = _C.empty(floats(64), "float32")
    del big
    misses = _C.cache_stats()["misses"]
    small = _C.empty(floats(4), "float32")  # 4 MiB would hold 64 MiB of memory
    assert _C.cache_stats()["misses"] == misses + 1
    assert _C.cache_stats()["cached_blocks"] == 1  # the 64 MiB block still waits
    # A request within an eighth of a block's size takes it: a batch's last, shorter step.
    del small
    near = _C.empty((61 * MiB // 4096, 1024), "float32")
    assert _C.cache_stats()["misses"] == misses + 1
    del near


def test_many_shapes_alternating_all_hit():
    # Ten sizes in turn, more than the four items the pool before this cache held.
    sizes = [floats(2 * (k + 1)) for k in range(10)]
    for shape in sizes:
        _C.empty(shape, "float32")  # made and freed at once
    misses = _C.cache_stats()["misses"]
    for _ in range(3):
        for shape in sizes:
            _C.empty(shape, "float32")
    assert _C.cache_stats()["misses"] == misses


def test_past_the_limit_the_longest_waiting_blocks_go():
    _C.set_cache_limit(8 * MiB)  # two 4 MiB blocks
    tensors = [_C.empty(floats(4), "float32") for _ in range(3)]
    addresses = [t.data_ptr() for t in tensors]
    evictions = _C.cache_stats()["evictions"]
    while tensors:  # freed in order: the first waits longest
        tensors.pop(0)
    stats = _C.cache_stats()
    assert stats["evictions"] == evictions + 1
    assert stats["cached_blocks"] == 2 and stats["cached_bytes"] == 8 * MiB
    kept = [_C.empty(floats(4), "float32") for _ in range(2)]
    assert {t.data_ptr() for t in kept} == set(addresses[1:])
    del kept
    _C.set_cache_limit(0)  # a lower limit evicts down to it at once
    assert _C.cache_stats()["cached_bytes"] == 0


def test_big_blocks_are_whole_huge_pages():
    # 1 MiB or more: a mapping of its own, 2 MiB-aligned and a whole number of 2 MiB pages,
    # so that every page of it can be a huge page.
    t = _C.empty((3 * MiB // 4096, 1024), "float32")  # 3 MiB
    assert t.data_ptr() % (2 * MiB) == 0
    del t
    assert _C.cache_stats()["cached_bytes"] == 4 * MiB


def test_small_requests_share_power_of_two_classes():
    a = _C.empty((1, 100), "float32")  # 400 bytes: the 512-byte class
    address = a.data_ptr()
    del a
    b = _C.empty((1, 120), "float32")  # 480 bytes, the same class
    assert b.data_ptr() == address
    assert b.data_ptr() % 64 == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_a_tensor_comes_in_its_shape_and_dtype(dtype):
    # What the module asks for with no view after it: a (B, T, d) output in the tables' dtype
    # (an odd width too), a mask's int64 words; one block's bytes whatever the dtype.
    name = str(dtype).split(".")[1]
    for shape in [(2, 3, 5), (7,), (3, 1)]:
        t = _C.empty(shape, name)
        assert (t.shape, t.dtype, t.is_contiguous()) == (torch.Size(shape), dtype, True)
        t.fill_(3)  # the memory is the tensor's own, all of it
        assert t.sum().item() == 3 * t.numel()
    misses = _C.cache_stats()["misses"]
    again = _C.empty((7,), name)  # a block of the 512-byte class, freed above
    assert _C.cache_stats()["misses"] == misses
    del again


def test_an_unknown_dtype_is_refused_naming_the_ones_it_takes():
    with pytest.raises(InvalidInputError, match="'float64' is not one of float32, bfloat16, float16, int64"):
        _C.empty((2, 2), "float64")


def step(module, ids, grad):
    module.token_table.grad = module.position_table.grad = None  # zero_grad(set_to_none=True)
    module(ids).backward(grad)


@pytest.mark.parametrize("sparse", [False, True])
def test_module_steps_reuse_storage_and_take_no_page_faults(sparse):
    # Two shapes in turn (as training and evaluation batches), dropout on: output, mask and
    # both gradients come from the cache once each shape has run.
    torch.manual_seed(0)
    module = LearnedPositionEmbedding(20000, 512, 256, dropout=0.1, seed=1, sparse=sparse)
    batches = [(torch.randint(0, 20000, (b, t)), torch.randn(b, t, 256))
               for b, t in ((8, 512), (4, 200))]
    for _ in range(2):
        for ids, grad in batches:
            step(module, ids, grad)
    misses = _C.cache_stats()["misses"]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    steps = 10
    for _ in range(steps // 2):
        for ids, grad in batches:
            step(module, ids, grad)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    assert _C.cache_stats()["misses"] == misses
    # Fresh storage faults its pages in: from torch's allocator (4 KiB pages where THP is
    # `madvise`) the 20 MB dense token gradient alone would be 4,883 faults, the 4 MB output
    # 1,024. Python's and torch's small allocations may fault a page now and then; a few per
    # step is that, not an output or gradient.
    assert faults <= 4 * steps, f"{faults} minor page faults in {steps} steps"


def test_default_positions_are_made_once_per_shape():
    # past_length + t depends only on the ids' shape: a step reuses the last one's ids instead
    # of writing (B, T) int64 again. Each shape and offset still gets its own positions.
    module = LearnedPositionEmbedding(100, 64, 8, seed=2).eval()
    ids = torch.randint(0, 100, (3, 16))
    first = module(ids)
    cached = module._positions_cache[1]
    module(ids)
    assert module._positions_cache[1] is cached
    for shape, past in (((3, 16), 0), ((2, 5), 0), ((2, 5), 7), ((4, 2, 5), 3), ((5,), 1)):
        x = torch.randint(0, 100, shape)
        explicit = torch.arange(past, past + shape[-1]).expand(shape)
        assert torch.equal(module(x, past_length=past), module(x, position_ids=explicit))
    assert torch.equal(module(ids), first)
    # What position_ids() returns is the caller's own, not the reused tensor.
    assert module.position_ids(ids) is not module._positions_cache[1]
