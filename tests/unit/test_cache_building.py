"""Building caches: the factory, the device a cache is built on, and the argument checks every cache
type shares (storage buffers, dimensions, positions, layer windows), each on its boundary value.

Device: on a machine without CUDA, ``device=None`` and ``device="cpu"`` build the same cache, so
a device dropped on the way is invisible there. ``meta`` (sizes only, no memory) is a device every
cache accepts: a cache asked for ``meta`` must be on ``meta``, and so must everything it returns.
"""

from __future__ import annotations

import random

import pytest
import torch

from infer_ref import ModelConfig
from infer_ref.cache.contiguous import KVCache
from infer_ref.cache.dynamic import DynamicKVCache
from infer_ref.cache.factory import CACHE_KINDS, build_cache
from infer_ref.cache.paged import PagedKVCache
from infer_ref.cache.position import DevicePosition, HostPosition
from infer_ref.cache.protocol import plan_step
from infer_ref.cache.slots import slots_through_tables
from infer_ref.cache.snapshot import KVSnapshot
from infer_ref.cache.static import StaticKVCache
from infer_ref.cache.static_paged import StaticPagedKVCache
from infer_ref.cache.windows import check_layer_windows, model_layer_windows
from infer_ref.conformance.checkpoints.snapshots import tiny_config

META = torch.device("meta")
LLAMA = ModelConfig.from_hf_dict(tiny_config("llama"))
GEMMA = ModelConfig.from_hf_dict(tiny_config("gemma3_text"))  # layer windows (6, 6, None, 6)
GEMMA_WINDOWS = [6, 6, None, 6]
TYPES = {"contiguous": KVCache, "static": StaticKVCache, "dynamic": DynamicKVCache, "paged": PagedKVCache,
         "static-paged": StaticPagedKVCache}  # fmt: skip


def _write(cache, n: int, *, device: str | torch.device = "cpu", seed: int = 0) -> list[torch.Tensor]:
    """Write ``n`` random positions (K = V) into every layer and commit them; returns each layer's K."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for layer in range(cache.num_layers):
        k = torch.randn(cache.batch_size, cache.num_kv_heads, n, cache.head_dim, generator=g).to(cache.dtype).to(device)
        cache.update(layer, k, k)
        out.append(k)
    cache.advance(n)
    return out


# -- the factory -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", CACHE_KINDS)
def test_factory_builds_the_named_type_on_the_named_device(kind: str) -> None:
    cache = build_cache(kind, LLAMA, 10, batch_size=2, dtype=torch.float32, device="meta", block_size=4)
    assert type(cache) is TYPES[kind]
    assert (cache.device, cache.dtype, cache.batch_size) == (META, torch.float32, 2)
    k, v = cache.get_kv(0)
    assert k.device == v.device == META
    if kind != "dynamic":
        assert cache.max_seq_len == 10  # not the 12 positions of 3 blocks of 4


@pytest.mark.parametrize("kind", ["paged", "static-paged"])
@pytest.mark.parametrize("seed", [None, 7])
def test_factory_scrambles_the_free_list_with_the_seed(kind: str, seed: int | None) -> None:
    # 1 row of ceil(10 / 4) = 3 blocks; the pool's free list is 0, 1, 2, shuffled by Random(seed).
    order = [0, 1, 2]
    if seed is not None:
        random.Random(seed).shuffle(order)
        assert order != [0, 1, 2]  # the seed does scramble these three
    cache = build_cache(kind, LLAMA, 10, dtype=torch.float32, device="cpu", block_size=4, scramble_seed=seed)
    assert cache.block_size == 4 and cache.pool.num_blocks == 3
    _write(cache, 10)
    table = cache.block_tables[0] if kind == "paged" else cache.block_table[0].tolist()
    assert table == order


# -- the device, kept by every constructor -------------------------------------------------------------


@pytest.mark.parametrize("kind", CACHE_KINDS)
def test_snapshot_round_trip_stays_on_the_device(kind: str) -> None:
    cache = build_cache(kind, LLAMA, 8, dtype=torch.float32, device="meta", block_size=4)
    _write(cache, 3, device="meta")
    copy = type(cache).from_snapshot(cache.snapshot())
    assert copy.device == copy.get_kv(0)[0].device == META and copy.seq_len == 3


@pytest.mark.parametrize("kind", CACHE_KINDS)
def test_steps_are_planned_on_the_cache_device(kind: str) -> None:
    cache = build_cache(kind, LLAMA, 8, dtype=torch.float32, device="meta", block_size=4)
    assert cache.plan_step(2, [None, None]).positions.device == META
    assert plan_step(None, 2, [None, None], META).positions.device == META


def test_an_outside_cache_is_planned_from_its_length_on_the_device_asked() -> None:
    # A cache that is not one of ours (only the protocol's seq_len): the step starts after its
    # length, on the device the caller names.
    class Outside:
        seq_len = 3

    step = plan_step(Outside(), 2, [None, None], META)  # type: ignore[arg-type]
    assert step.positions.device == META and step.mask(0).device == META
    assert plan_step(Outside(), 2, [None], torch.device("cpu")).positions.tolist() == [3, 4]


def test_restore_moves_the_snapshot_to_the_cache_device() -> None:
    source = DynamicKVCache(2, 1, 4, dtype=torch.float32, device="cpu")
    _write(source, 3)
    cache = DynamicKVCache(2, 1, 4, dtype=torch.float32, device="meta")
    cache.restore(source.snapshot())
    k, v = cache.get_kv(1)
    assert k.device == v.device == META and cache.seq_len == 3


def test_static_cache_on_meta_writes_and_reads_there() -> None:
    cache = StaticKVCache.allocate(2, 2, 4, 8, dtype=torch.float32, device="meta")
    assert cache.pos.device == cache.position.slots.device == META
    _write(cache, 3, device="meta")
    assert cache.get_kv(0)[0].device == META


def test_an_empty_dynamic_cache_reads_in_its_dtype_and_device() -> None:
    cache = DynamicKVCache(2, 3, 4, batch_size=2, dtype=torch.float64, device="meta")
    k, v = cache.get_kv(1)
    assert k.shape == v.shape == (2, 3, 0, 4)
    assert k.dtype == v.dtype == torch.float64 and k.device == v.device == META


# -- defaults -------------------------------------------------------------------------------------------


def test_dynamic_defaults_to_one_row() -> None:
    assert DynamicKVCache.from_model_config(LLAMA, device="cpu").batch_size == 1


# -- sizes and positions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", ["num_layers", "num_kv_heads", "head_dim", "max_seq_len", "batch_size"])
def test_contiguous_dimension_of_zero_refused(dim: str) -> None:
    args = {"num_layers": 1, "num_kv_heads": 1, "head_dim": 1, "max_seq_len": 1, "batch_size": 1, dim: 0}
    with pytest.raises(ValueError, match=rf"cache dimensions must be positive integers, got \{{'{dim}': 0\}}"):
        KVCache.allocate(args.pop("num_layers"), args.pop("num_kv_heads"), args.pop("head_dim"), args.pop("max_seq_len"),
                         device="cpu", **args)  # fmt: skip


def test_dimensions_of_one_accepted() -> None:
    cache = KVCache.allocate(1, 1, 1, 1, batch_size=1, dtype=torch.float32, device="cpu")
    assert cache.k.shape == (1, 1, 1, 1, 1)


@pytest.mark.parametrize("dim", ["num_layers", "num_kv_heads", "head_dim", "batch_size"])
def test_dynamic_dimension_of_zero_refused(dim: str) -> None:
    args = {"num_layers": 1, "num_kv_heads": 1, "head_dim": 1, "batch_size": 1, dim: 0}
    with pytest.raises(ValueError, match=rf"cache dimensions must be positive integers, got \{{'{dim}': 0\}}"):
        DynamicKVCache(args.pop("num_layers"), args.pop("num_kv_heads"), args.pop("head_dim"), device="cpu", **args)


def test_dynamic_reads_only_committed_positions() -> None:
    cache = DynamicKVCache(1, 1, 2, dtype=torch.float32, device="cpu")
    k = torch.ones(1, 1, 3, 2)
    cache.update(0, k, k)  # written, not yet advanced over
    assert cache.get_kv(0)[0].shape[2] == 0


@pytest.mark.parametrize("make", [lambda: HostPosition(4), lambda: DynamicKVCache(1, 1, 2, device="cpu"),
                                  lambda: DevicePosition(4, 4, 1, torch.device("cpu"))])  # fmt: skip
def test_advance_by_zero_refused_naming_the_call(make) -> None:
    with pytest.raises(ValueError, match=r"^advance\(n\) needs a positive integer n, got 0$"):
        make().advance(0)


def test_overflow_names_the_last_position_needed() -> None:
    # 3 positions at 5 are positions 5, 6, 7: position 7 is past a capacity of 6.
    with pytest.raises(Exception, match=r"^KV cache overflow: 3 position\(s\) at 5 need position 7, but max_seq_len is 6$"):
        HostPosition(6, 5).advance(3)


def test_start_position_bounds() -> None:
    assert HostPosition(4, 4).seq_len == 4  # full from the start: allowed
    for bad in (5, -1, True):
        with pytest.raises(ValueError, match=r"seq_len must be an integer in \[0, 4\]"):
            HostPosition(4, bad)


@pytest.mark.parametrize("bad", [5, -1, True])
def test_set_position_bounds(bad: object) -> None:
    position = HostPosition(4, 2)
    with pytest.raises(ValueError, match=r"position must be an integer in \[0, 4\]"):
        position.set(bad)
    assert position.seq_len == 2


def test_static_cache_starts_at_the_given_position() -> None:
    k, v = torch.zeros(2, 1, 1, 8, 2), torch.zeros(2, 1, 1, 8, 2)
    cache = StaticKVCache(k, v, seq_len=3)
    assert cache.seq_len == 3 and int(cache.pos) == 3 and cache.get_kv(0)[0].shape[2] == 3


def test_crop_and_update_errors_name_the_argument() -> None:
    cache = KVCache.allocate(1, 1, 2, 4, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match=r"^crop\(n\) needs a non-negative integer n, got -1$"):
        cache.crop(-1)
    with pytest.raises(TypeError, match="^v must be a torch.Tensor, got str$"):
        cache.update(0, torch.zeros(1, 1, 1, 2), "v")


# -- storage buffers -------------------------------------------------------------------------------------


def test_buffers_of_the_wrong_rank_refused_naming_the_layout() -> None:
    with pytest.raises(ValueError, match=r"^k and v must both be \[num_layers, batch, num_kv_heads, max_seq_len, head_dim\], "):
        KVCache(torch.zeros(2, 3), torch.zeros(2, 3))


def test_buffers_that_are_not_tensors_refused() -> None:
    with pytest.raises(TypeError, match="^k and v must be tensors, got Tensor and NoneType$"):
        KVCache(torch.zeros(1, 1, 1, 2, 2), None)


def test_buffers_of_different_dtypes_refused() -> None:
    with pytest.raises(ValueError, match="^k and v must share dtype and device"):
        KVCache(torch.zeros(1, 1, 1, 2, 2), torch.zeros(1, 1, 1, 2, 2, dtype=torch.float64))


@pytest.mark.parametrize("which", ["k", "v"])
def test_broadcast_buffer_refused_naming_it(which: str) -> None:
    own = torch.zeros(2, 1, 1, 4, 2)
    shared = torch.zeros(1, 1, 1, 4, 2).expand(2, 1, 1, 4, 2)  # both layers alias one slice (stride 0, size 2)
    k, v = (shared, own) if which == "k" else (own, shared)
    with pytest.raises(ValueError, match=rf"^{which} broadcasts one storage slice over several entries"):
        KVCache(k, v)


def test_stride_zero_over_one_entry_accepted() -> None:
    # A size-1 dimension aliases nothing, whatever its stride.
    k = torch.zeros(8).as_strided((1, 1, 1, 4, 2), (0, 0, 0, 2, 1))
    cache = KVCache(k, torch.zeros(1, 1, 1, 4, 2))
    assert cache.max_seq_len == 4


# -- snapshots -------------------------------------------------------------------------------------------


def test_snapshot_needs_five_dimensional_keys() -> None:
    t = torch.zeros(1, 1, 2, 2)
    with pytest.raises(ValueError, match=r"keys and values must both be \[L, B, Hkv, S, D\]"):
        KVSnapshot(t, t.clone(), KVCache, {})


def test_contiguous_from_a_snapshot_without_a_capacity() -> None:
    # A dynamic cache's snapshot names no capacity: the copy holds what the snapshot holds.
    source = DynamicKVCache(2, 1, 2, dtype=torch.float32, device="cpu")
    written = _write(source, 1)
    copy = KVCache.from_snapshot(source.snapshot())
    assert copy.max_seq_len == 1 and copy.seq_len == 1 and torch.equal(copy.get_kv(1)[0], written[1])


def test_contiguous_repr_names_the_type() -> None:
    assert repr(KVCache.allocate(1, 1, 2, 4, device="cpu")).startswith("KVCache(layers=1, batch=1")


# -- slots and layer windows -------------------------------------------------------------------------------


def test_slots_past_the_last_block_read_the_last_block() -> None:
    # Blocks of 4; row 0 holds blocks 3 then 1. Positions 0 and 5 are slots 12 and 4+1; position 9
    # is past both blocks and is clamped to the last one: 4 + 9 % 4 = 5.
    table = torch.tensor([[3, 1]], dtype=torch.int32)
    assert slots_through_tables(table, torch.tensor([[0, 5, 9]]), 4).tolist() == [[12, 5, 5]]


def test_layer_windows_from_the_model_config() -> None:
    assert model_layer_windows(GEMMA) == GEMMA_WINDOWS
    assert StaticKVCache.from_model_config(GEMMA, 8, device="cpu").layer_windows == GEMMA_WINDOWS


def test_layer_window_bounds() -> None:
    assert check_layer_windows([1, None], 2) == [1, None]  # a window of one position is allowed
    for bad in ([True, None], [0, None], [2]):
        with pytest.raises(ValueError, match="layer_windows must give each of the 2 layers a positive window or None"):
            check_layer_windows(bad, 2)


def test_static_cache_keeps_one_window_per_layer() -> None:
    # 3 layers, 2 rows: the windows are counted against the layers, not the rows.
    k, v = torch.zeros(3, 2, 1, 4, 2), torch.zeros(3, 2, 1, 4, 2)
    assert StaticKVCache(k, v, layer_windows=(2, None, 1)).layer_windows == [2, None, 1]
    with pytest.raises(ValueError, match="layer_windows must give each of the 3 layers"):
        StaticKVCache(k.clone(), v.clone(), layer_windows=[2, None])
