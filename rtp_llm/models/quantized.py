"""Weights kept as their GGUF file stores them: QuantizedWeight holds a tensor's blocks, uint8 [N, blocks, block
bytes], read by the device's quantized kernels in place of a float copy (the CPU's repack them once at load into
their interleaved layout, torch.ops.rtp_llm.quant_pack, and read that).
The math stays the dequantized model's: every weight is the float32 value gguf's dequantize gives."""

from __future__ import annotations

import warnings

import numpy as np
import torch

# GGUF formats kept as blocks, with their block bytes (the block size tells them apart) and weights per block.
BLOCK_BYTES = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}
BLOCK_ELEMENTS = {f: 256 if f.endswith("_K") else 32 for f in BLOCK_BYTES}
# auto: keep a GGUF's block formats; none: dequantize at load; int8: every linear layer's weight (of any checkpoint)
# as per-output-channel symmetric int8 made at load, in Q8_0 blocks that share their row's scale (same kernels).
QUANTIZATION_MODES = ("auto", "none", "int8")


class QuantizedWeight:
    """blocks: uint8 [N, K / weights per block, block bytes], a torch tensor, or a numpy view of the file's mapping that is copied
    into memory of its own on first use (so each byte is copied once, and nothing of the file stays mapped); or
    several such (cat: their rows in order), concatenated only when a caller asks for `blocks`."""

    def __init__(self, blocks: torch.Tensor | np.ndarray | list, fmt: str):
        parts = blocks if isinstance(blocks, list) else [blocks]
        for part in parts:
            if fmt not in BLOCK_BYTES or part.dtype not in (torch.uint8, np.uint8) or part.ndim != 3 \
                    or part.shape[2] != BLOCK_BYTES[fmt] or part.shape[1] != parts[0].shape[1]:
                raise ValueError(f"not {fmt} blocks: {part.dtype} {tuple(part.shape)}")
        self._parts, self.format = parts, fmt
        self._shape = (sum(p.shape[0] for p in parts), parts[0].shape[1] * BLOCK_ELEMENTS[fmt])
        self._nbytes = sum(int(np.prod(p.shape)) for p in parts)
        self._packed: torch.Tensor | None = None
        self._row_order: torch.Tensor | None = None

    def repacked(self, packed: torch.Tensor, row_order: torch.Tensor | None = None) -> None:
        """From now on the blocks live only in `packed`, the CPU kernels' interleaved layout of them
        (torch.ops.rtp_llm.quant_pack): rows() and dequantize() read it, the stored blocks are released.
        row_order: where each row went when the rows were packed in another order (a gated gate_up's), else None."""
        self._packed, self._parts, self._row_order = packed, None, row_order

    @property
    def packed(self) -> torch.Tensor | None:
        return self._packed

    @property
    def row_order(self) -> torch.Tensor | None:
        return self._row_order

    def file_blocks(self) -> list[torch.Tensor]:
        """The parts to read once (quant_pack): the file's mapping itself where they are still views of it, so no
        copy is made to be freed afterwards (freed copies of a whole model stay in the allocator's heap)."""
        self._check_kept()
        out = []
        for part in self._parts:
            if isinstance(part, np.ndarray) and not part.flags.c_contiguous:
                part = np.ascontiguousarray(part)
            with warnings.catch_warnings():  # a read-only mapping: the tensor is only read
                warnings.simplefilter("ignore", UserWarning)
                out.append(torch.from_numpy(part) if isinstance(part, np.ndarray) else part.contiguous())
        return out

    def _check_kept(self) -> None:
        if self._parts is None:
            raise RuntimeError("the blocks were repacked for the CPU kernels (QuantizedWeight.packed)")

    @property
    def blocks(self) -> torch.Tensor:
        self._check_kept()
        if len(self._parts) > 1 or isinstance(self._parts[0], np.ndarray):
            if all(isinstance(p, np.ndarray) for p in self._parts):
                whole = torch.from_numpy(np.concatenate(self._parts) if len(self._parts) > 1
                                         else np.array(self._parts[0], order="C"))
            else:
                whole = torch.cat([torch.from_numpy(np.array(p)) if isinstance(p, np.ndarray) else p
                                   for p in self._parts])
            self._parts = [whole]
        if not self._parts[0].is_contiguous():
            self._parts = [self._parts[0].contiguous()]
        return self._parts[0]

    @property
    def mapped(self) -> bool:
        """Whether some of the blocks are still a view of the file's mapping (copied on first use of `blocks`)."""
        return self._parts is not None and any(isinstance(p, np.ndarray) for p in self._parts)

    @property
    def shape(self) -> tuple[int, int]:
        return self._shape

    @property
    def nbytes(self) -> int:
        """The stored blocks' bytes (the packed layout is within 3% of them: quant_packed.h)."""
        return self._nbytes

    @classmethod
    def per_channel_int8(cls, w: torch.Tensor) -> "QuantizedWeight | None":
        """Symmetric int8 per output row: scale = max|row| / 127 as fp16, q = round(w / scale) in [-127, 127], laid
        out as Q8_0 blocks that all carry their row's scale; None when K is not a multiple of 32."""
        rows, cols = w.shape
        if cols % 32:
            return None
        w = w.float()
        scale = (w.abs().amax(dim=1) / 127).half()
        s = scale.float().unsqueeze(1)
        q = torch.where(s > 0, w / torch.where(s > 0, s, 1.0), 0.0).round().clamp(-127, 127).to(torch.int8)
        blocks = torch.empty(rows, cols // 32, 34, dtype=torch.uint8)
        blocks[:, :, 0:2] = scale.view(torch.uint8).reshape(rows, 1, 2)
        blocks[:, :, 2:] = q.view(torch.uint8).reshape(rows, cols // 32, 32)
        return cls(blocks, "Q8_0")

    def int_groups(self):
        """The matrix as integers with a scale and offset per 32 columns (rtp_llm/models/int_groups.py), or None
        where the format does not map (Q6_K)."""
        from rtp_llm.models.int_groups import int_groups

        return int_groups(self.blocks, self.format)

    def dequantize(self) -> torch.Tensor:
        if self._packed is not None:
            return self.rows(torch.arange(self._shape[0]))
        from rtp_llm._native import ops

        return ops().quant_dequantize(self.blocks)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` dequantized (an embedding lookup reads only these)."""
        from rtp_llm._native import ops

        if self._packed is not None:
            if self._row_order is None:
                return ops().quant_packed_rows(self._packed, ids.long(), self._shape[0])
            return ops().quant_packed_rows(self._packed, self._row_order[ids.long()], self._packed.shape[0] * 16)
        return ops().quant_dequantize(self.blocks.index_select(0, ids.reshape(-1))).reshape(*ids.shape, -1)

    def narrow(self, dim: int, start: int, stop: int) -> "QuantizedWeight | None":
        """Rows (dim 0) or columns (dim 1) [start, stop) as whole blocks, for a tensor-parallel shard; None when a
        column range does not fall on block boundaries (the caller then dequantizes)."""
        stored = self._parts[0] if len(self._parts) == 1 else self.blocks  # a view of the file where it is one
        if dim == 0:
            return QuantizedWeight(stored[start:stop], self.format)
        per = BLOCK_ELEMENTS[self.format]
        if start % per or stop % per:
            return None
        return QuantizedWeight(stored[:, start // per:stop // per], self.format)

    def as_q8_0(self) -> "QuantizedWeight":
        """A Q4_0 or Q5_0 matrix as Q8_0 blocks with the same scales and q - 8 (q - 16) as the int8 quants: every weight
        the same float32 (the product of the same two numbers), in 34 bytes per 32 instead of 18 (22)."""
        if self.format == "Q8_0":
            return self
        if self.format not in ("Q4_0", "Q5_0"):
            raise ValueError(f"{self.format} blocks have no exact Q8_0 form")
        b = self.blocks
        qs = b[..., -16:]
        q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).to(torch.int16)  # elements 0-15, 16-31
        if self.format == "Q5_0":
            qh = b[..., 2:6].to(torch.int64)
            bits = qh[..., 0] | qh[..., 1] << 8 | qh[..., 2] << 16 | qh[..., 3] << 24
            fifth = (bits.unsqueeze(-1) >> torch.arange(32)) & 1
            q = (q | (fifth << 4).to(torch.int16)) - 16
        else:
            q = q - 8
        out = torch.empty(*b.shape[:-1], 34, dtype=torch.uint8)
        out[..., 0:2] = b[..., 0:2]
        out[..., 2:] = q.to(torch.int8).view(torch.uint8)
        return QuantizedWeight(out, "Q8_0")

    @staticmethod
    def cat(parts: list["QuantizedWeight"]) -> "QuantizedWeight | None":
        """Row-wise concatenation (q | k | v, gate | up) when every part has the same format, or when they mix Q8_0,
        Q5_0 and Q4_0 (as llama.cpp's k-quant mixes write a v_proj in Q8_0 beside Q5_0 q and k): then all as Q8_0,
        the same values (as_q8_0); else None."""
        if len({p.format for p in parts}) != 1:
            if not all(p.format in ("Q8_0", "Q5_0", "Q4_0") for p in parts):
                return None
            parts = [p.as_q8_0() for p in parts]
        if len(parts) == 1:
            return parts[0]
        for p in parts:
            p._check_kept()
        return QuantizedWeight([b for p in parts for b in p._parts], parts[0].format)
