"""How far a fused model may be from its adapter model, derived from the dtype and the quantization.

Fusing replaces a base weight W and its LoRA pair by one weight W' that stands for W* = W + s B^T A^T
(s = LoRA scale), which `exact_weight` computes in float32 from the adapter model's own arrays (a quantized
W dequantized). W' differs from W* only by rounding, and `element_bound` bounds each element:
- stored in a float dtype of unit roundoff u (2^-8 bfloat16, 2^-11 float16, 2^-24 float32), where mlx-lm
  rounds the delta and then the sum: |W' - W*| <= u (|W*| + 2 |dW|) + 4 u32 (|W| + |dW|);
- re-quantized (affine, b bits, one scale and bias per group, as mlx-lm's `fuse()` does for a quantized
  base): MLX's quantizer keeps every element within one step (its group's |scale|, which may be negative) of its input, and the step
  and bias are stored in a float dtype of unit roundoff u_s, so |W' - W*| <= scale + u_s (scale (2^b - 1) +
  |bias|) plus the float rounding of the sum above, which the quantizer receives.
`weight_error` checks every element of a fused layer and returns its relative perturbation
rho = ||W' - W*|| / ||W*|| (Frobenius); with `dequantize`, every other quantized weight is rounded to the float
dtype once, so rho is at least that dtype's u. The fused model's logits then differ from the adapter model's by the
forward pass's own rounding (unit roundoff u_c of the compute dtype, per operation) and by the perturbation of
the weights; with L blocks whose errors add independently (a random walk, so sqrt(L)) and a margin of 4:
    limit = atol + S (rtol + 4 sqrt(L) (u_c + rho_max)),     S = max |adapter logits|.
In float32 this is the old fixed limit (atol + rtol S, 1e-4 each) plus ~1e-6 S. In bfloat16 it is about
0.02 sqrt(L) S. A re-quantized output is as far from the adapter model as a second 4-bit quantization of every
adapted layer makes it (rho ~ 0.1 for 4 bits), which the bound states rather than hides: `--dequantize` keeps
the fused weights in the base's float dtype instead.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn

MARGIN = 4.0


def unit_roundoff(dtype) -> float:
    """Half the distance from 1 to the next number of a float dtype: the relative error of one rounding."""
    return float(mx.finfo(dtype).eps) / 2


def dense_weight(linear) -> mx.array:
    """A linear layer's weight in float32 (dequantized when the layer is quantized)."""
    if isinstance(linear, nn.QuantizedLinear):
        return mx.dequantize(linear.weight, linear.scales, linear.biases, group_size=linear.group_size,
                             bits=linear.bits, mode=linear.mode).astype(mx.float32)
    return linear.weight.astype(mx.float32)


def exact_weight(lora_layer) -> tuple[mx.array, mx.array, mx.array]:
    """(W, dW, W* = W + dW) in float32 for an mlx-lm LoRA layer: dW = scale * B^T A^T."""
    base = dense_weight(lora_layer.linear)
    delta = (lora_layer.scale * lora_layer.lora_b.astype(mx.float32).T) @ lora_layer.lora_a.astype(mx.float32).T
    return base, delta, base + delta


def element_bound(fused, base: mx.array, delta: mx.array, exact: mx.array) -> mx.array:
    """The largest |W' - W*| rounding allows for each element of the `fused` layer (module docstring)."""
    float_dtype = fused.scales.dtype if isinstance(fused, nn.QuantizedLinear) else fused.weight.dtype
    u, u32 = unit_roundoff(float_dtype), unit_roundoff(mx.float32)
    bound = u * (mx.abs(exact) + 2 * mx.abs(delta)) + 4 * u32 * (mx.abs(base) + mx.abs(delta))
    if isinstance(fused, nn.QuantizedLinear):
        scales, biases = mx.abs(fused.scales.astype(mx.float32)), fused.biases.astype(mx.float32)
        group = scales * (1 + u * (2 ** fused.bits - 1)) + u * mx.abs(biases)
        bound = bound + mx.repeat(group, fused.group_size, axis=-1)
    return bound


def weight_error(lora_layer, fused) -> tuple[float, float]:
    """(the largest |W' - W*| / its bound over the elements (<= 1 when fused right), rho) for one layer."""
    base, delta, exact = exact_weight(lora_layer)
    error = mx.abs(dense_weight(fused) - exact)
    worst = mx.max(error / mx.maximum(element_bound(fused, base, delta, exact), 1e-30))
    rho = mx.sqrt(mx.sum(error * error)) / mx.maximum(mx.sqrt(mx.sum(exact * exact)), 1e-30)
    mx.eval(worst, rho)
    return worst.item(), rho.item()


def logits_limit(scale: float, blocks: int, compute_dtype, rho: float, rtol: float, atol: float) -> float:
    """atol + S (rtol + MARGIN sqrt(L) (u_c + rho)), see the module docstring."""
    return atol + scale * (rtol + MARGIN * math.sqrt(max(blocks, 1)) * (unit_roundoff(compute_dtype) + rho))
