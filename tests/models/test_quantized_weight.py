"""QuantizedWeight (rtp_llm/models/quantized.py): blocks kept as the file stores them; a Q4_0 / Q5_0 matrix widened
to Q8_0 blocks where a fused projection mixes it with Q8_0 parts, every weight the value gguf's dequantize gives the
original blocks (bits compared, extreme scales included)."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants  # noqa: E402

from rtp_llm.models.quantized import QuantizedWeight  # noqa: E402
from tests.models.gguf_blocks import as_blocks, bytewise, quantized  # noqa: E402


def values(q: QuantizedWeight) -> np.ndarray:
    return quants.dequantize(q.blocks.reshape(q.shape[0], -1).numpy(), getattr(T, q.format))


@pytest.mark.parametrize("fmt", ["Q4_0", "Q5_0"])
@pytest.mark.parametrize("make", [quantized, bytewise])
def test_q4_0_and_q5_0_widen_to_q8_0_with_the_same_values(fmt, make):
    raw = make(fmt, 9, 256, seed=21)
    wide = QuantizedWeight(as_blocks(raw, fmt), fmt).as_q8_0()
    assert wide.format == "Q8_0" and wide.shape == (9, 256) and wide.nbytes == 9 * 8 * 34
    theirs = quants.dequantize(raw, getattr(T, fmt))
    assert np.array_equal(values(wide).view(np.uint32), theirs.view(np.uint32))


def test_cat_of_mixed_parts():
    q = QuantizedWeight(as_blocks(quantized("Q5_0", 8, 64, seed=1), "Q5_0"), "Q5_0")
    k = QuantizedWeight(as_blocks(quantized("Q4_0", 4, 64, seed=2), "Q4_0"), "Q4_0")
    v = QuantizedWeight(as_blocks(quantized("Q8_0", 4, 64, seed=3), "Q8_0"), "Q8_0")
    qkv = QuantizedWeight.cat([q, k, v])
    assert qkv.format == "Q8_0" and qkv.shape == (16, 64)
    expected = np.concatenate([values(q), values(k), values(v)])
    assert np.array_equal(values(qkv).view(np.uint32), expected.view(np.uint32))
    same = QuantizedWeight.cat([q, q])
    assert same.format == "Q5_0"  # one format: kept as it is
    other = QuantizedWeight(as_blocks(quantized("Q4_1", 4, 64, seed=4), "Q4_1"), "Q4_1")
    assert QuantizedWeight.cat([q, other]) is None  # Q4_1's min has no Q8_0 form: the caller dequantizes
    with pytest.raises(ValueError, match="no exact Q8_0 form"):
        other.as_q8_0()
