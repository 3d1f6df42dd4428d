"""Weight-only int8: the quantized matmul against the dense one, and when the engine switches to it."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from batchinfer.engine import EngineConfig
from batchinfer.engine.int8 import Int8Policy, Int8Weight


def test_int8_matmul_is_close_to_the_bf16_one():
    torch.manual_seed(0)
    weight, x = (torch.randn(960, 576) * 0.05).bfloat16(), torch.randn(3, 576).bfloat16()
    packed = Int8Weight.quantize(weight)
    assert packed.qweight.dtype == torch.int8 and packed.qweight.abs().max() <= 127
    dequantized = packed.qweight.float() * packed.scales.float()[:, None]
    assert (dequantized - weight.float()).abs().max() <= packed.scales.float().max() / 2 + 1e-3
    torch.testing.assert_close(packed(x).float(), F.linear(x, weight).float(), atol=0.05, rtol=0.05)


def test_int8_weights_are_made_only_after_enough_small_steps_and_used_only_for_them():
    calls = []
    dense = {"w": torch.randn(8, 16).bfloat16()}
    policy = Int8Policy(max_rows=4, after_steps=2)

    def weights():
        calls.append(1)
        return dense

    assert policy.for_step(5, weights) is None  # a big step neither counts nor uses int8
    assert policy.for_step(4, weights) is None and policy.for_step(1, weights) is None
    made = policy.for_step(2, weights)
    assert made is not None and set(made) == {"w"} and len(calls) == 1
    assert policy.for_step(3, weights) is made and len(calls) == 1
    assert policy.for_step(64, weights) is None


def test_int8_is_on_by_default_only_for_bf16_on_cpu():
    assert EngineConfig(dtype="bfloat16").int8_max_rows > 0
    assert EngineConfig(dtype="float32").int8_max_rows == 0
    assert EngineConfig(dtype="bfloat16", int8_max_rows=0).int8_max_rows == 0


def test_a_negative_int8_row_limit_is_refused_by_name():
    with pytest.raises(ValueError, match="int8_max_rows"):
        EngineConfig(int8_max_rows=-1)
