"""Spark's hash partitioning of ``add.path``/``remove.path`` (Murmur3, seed 42, pmod), which
PROTOCOL.md requires for multi-part checkpoints."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from delta_mirror.delta.checkpoint.schema import _LONG

_SPARK_HASH_SEED = 42


# --------------------------------------------------------------------------------------------
# Spark's hash partitioning (multi-part checkpoints)
# --------------------------------------------------------------------------------------------

_U32 = pa.uint32()


def _u32(value: int) -> Any:
    return pa.scalar(value & 0xFFFFFFFF, _U32)


def _rotl(x: Any, r: int) -> Any:
    return pc.bit_wise_or(pc.shift_left(x, _u32(r)), pc.shift_right(x, _u32(32 - r)))


def _mix_k1(k: Any) -> Any:
    k = pc.multiply(k, _u32(0xCC9E2D51))
    return pc.multiply(_rotl(k, 15), _u32(0x1B873593))


def _mix_h1(h: Any, k: Any) -> Any:
    h = _rotl(pc.bit_wise_xor(h, k), 13)
    return pc.add(pc.multiply(h, _u32(5)), _u32(0xE6546B64))


def spark_hash_partition(paths: Any, num_parts: int) -> Any:
    """``pmod(murmur3(path, 42), num_parts)`` per path, exactly as Spark's ``repartition`` does.

    Spark hashes a string with ``Murmur3_x86_32.hashUnsafeBytes``: little-endian 4-byte blocks,
    then each trailing byte *sign-extended* as its own block (not standard Murmur3). Vectorised
    with Arrow compute so a million paths take well under a second. Returns int64 part indexes.
    """
    if isinstance(paths, pa.ChunkedArray):
        paths = paths.combine_chunks()
    paths = pc.cast(paths, pa.large_binary())
    n = len(paths)
    if n == 0:
        return pa.array([], _LONG)
    if paths.null_count:
        raise ValueError("paths must not be null")
    offsets_buf, data_buf = paths.buffers()[1], paths.buffers()[2]
    all_offsets = pa.Array.from_buffers(_LONG, n + 1, [None, offsets_buf], offset=paths.offset)
    starts = all_offsets.slice(0, n)
    lengths = pc.subtract(all_offsets.slice(1, n), starts)
    data_len = data_buf.size if data_buf is not None else 0
    data = pa.Array.from_buffers(pa.uint8(), data_len, [None, data_buf]) if data_len else None
    h = pa.repeat(_u32(_SPARK_HASH_SEED), n)
    max_len = pc.max(lengths).as_py() or 0
    zero = pa.scalar(0, _LONG)

    def byte_at(index: Any, active: Any) -> Any:
        assert data is not None
        return pc.cast(data.take(pc.if_else(active, index, zero)), _U32)

    for block in range(max_len // 4):
        active = pc.greater_equal(lengths, pa.scalar(4 * block + 4, _LONG))
        base = pc.add(starts, pa.scalar(4 * block, _LONG))
        word = byte_at(base, active)
        for t in (1, 2, 3):
            b = byte_at(pc.add(base, pa.scalar(t, _LONG)), active)
            word = pc.bit_wise_or(word, pc.shift_left(b, _u32(8 * t)))
        h = pc.if_else(active, _mix_h1(h, _mix_k1(word)), h)
    aligned = pc.subtract(lengths, pc.bit_wise_and(lengths, pa.scalar(3, _LONG)))
    for t in range(3):
        active = pc.greater(pc.subtract(lengths, aligned), pa.scalar(t, _LONG))
        if not pc.any(active).as_py():
            break
        b = byte_at(pc.add(pc.add(starts, aligned), pa.scalar(t, _LONG)), active)
        signed = pc.if_else(pc.greater(b, _u32(127)), pc.bit_wise_or(b, _u32(0xFFFFFF00)), b)
        h = pc.if_else(active, _mix_h1(h, _mix_k1(signed)), h)
    # fmix
    h = pc.bit_wise_xor(h, pc.cast(lengths, _U32))
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(16)))
    h = pc.multiply(h, _u32(0x85EBCA6B))
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(13)))
    h = pc.multiply(h, _u32(0xC2B2AE35))
    h = pc.bit_wise_xor(h, pc.shift_right(h, _u32(16)))
    # to signed int32, then pmod
    wide = pc.cast(h, _LONG)
    signed_h = pc.if_else(
        pc.greater_equal(wide, pa.scalar(1 << 31, _LONG)), pc.subtract(wide, pa.scalar(1 << 32, _LONG)), wide
    )
    p = pa.scalar(num_parts, _LONG)
    rem = pc.subtract(signed_h, pc.multiply(pc.divide(signed_h, p), p))
    return pc.if_else(pc.less(rem, zero), pc.add(rem, p), rem)


__all__: list[str] = [
    "spark_hash_partition",
]
