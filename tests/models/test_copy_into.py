"""`weights.copy_into` equals numpy's own assignment for every view the conversion tables produce."""

from __future__ import annotations

import numpy as np
import pytest

from jaxchat.models import weights
from jaxchat.models.weights import copy_into


@pytest.mark.parametrize("make", [
    lambda x: x,  # contiguous
    lambda x: x.T,  # [out, in] read as [in, out]
    lambda x: x.reshape(6, 4, 10).transpose(2, 0, 1),  # in_heads: [N*hd, D] -> [D, N, hd]
    lambda x: x.reshape(24, 2, 5).transpose(1, 2, 0),  # out_heads: [D, H*hd] -> [H, hd, D]
    lambda x: x[::2].T,  # strided both ways
    lambda x: x[3],  # one row
], ids=["contiguous", "transposed", "in_heads", "out_heads", "strided", "1d"])
@pytest.mark.parametrize("block_bytes", [16, 1 << 22])
def test_copy_into_equals_numpy_assignment(make, block_bytes, monkeypatch):
    monkeypatch.setattr(weights, "COPY_BLOCK_BYTES", block_bytes)  # 16: many blocks, some of one index
    src = make(np.random.default_rng(0).standard_normal((24, 10)).astype(np.float32))
    for dtype in (np.float32, np.float16):
        want = np.empty(src.shape, dtype)
        want[...] = src
        got = np.full(src.shape, np.nan, dtype)
        copy_into(got, src)
        np.testing.assert_array_equal(got, want)


def test_copy_into_a_slice_of_a_stacked_buffer_leaves_the_rest():
    buf = np.zeros((3, 10, 24), np.float32)
    src = np.arange(240, dtype=np.float32).reshape(24, 10)
    copy_into(buf[1], src.T)
    np.testing.assert_array_equal(buf[1], src.T)
    assert not buf[0].any() and not buf[2].any()
