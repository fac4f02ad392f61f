"""Variable-length feature values inside the feeder, and the sparse form a batch hands to the model.

Why two forms: parse groups (~16k records) are cut into batches and carried across group boundaries, which is a slice
of ``values`` by row splits (O(1) per batch); the model wants what TF's ``parse_example`` gives for a ``VarLenFeature``:
a SparseTensor ``[B, longest list in the batch]``, made once per batch by :meth:`Ragged.sparse`. No TensorFlow here:
the feeder's batches are numpy; the training loop wraps them.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from tfyarn.data import native


class SparseValue(NamedTuple):
    """A batch of a variable-length feature: TF's SparseTensorValue layout (``indices`` [nnz, 2] int64 in row-major
    order, ``values`` [nnz], ``dense_shape`` [2] int64). A session's ``feed_dict`` takes it for a sparse placeholder as
    it is; ``tf.SparseTensor(*value)`` makes the tensor."""

    indices: np.ndarray
    values: np.ndarray
    dense_shape: np.ndarray


class Ragged:
    """Rows of variable length: ``values`` of every row concatenated, row ``i`` = ``values[splits[i]:splits[i+1]]``
    (``splits[0]`` may be > 0: a slice shares its parent's values)."""

    __slots__ = ("values", "splits")

    def __init__(self, values: np.ndarray, splits: np.ndarray):
        self.values, self.splits = values, splits

    @classmethod
    def from_lengths(cls, values: np.ndarray, lengths: np.ndarray) -> "Ragged":
        splits = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=splits[1:])
        return cls(values, splits)

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[Any]], dtype: Any) -> "Ragged":
        flat = [v for r in rows for v in r]
        values = np.array(flat, dtype=dtype) if flat else np.empty(0, dtype=dtype)
        return cls.from_lengths(values, np.array([len(r) for r in rows], dtype=np.int64))

    def __len__(self) -> int:
        return len(self.splits) - 1

    def __getitem__(self, s: slice) -> "Ragged":
        if not isinstance(s, slice) or s.step not in (None, 1):
            raise TypeError("a Ragged is sliced by contiguous row ranges only")
        lo, hi, _ = s.indices(len(self))
        return Ragged(self.values, self.splits[lo : max(lo, hi) + 1])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.splits)

    def flat(self) -> np.ndarray:
        """This slice's values only."""
        return self.values[self.splits[0] : self.splits[-1]]

    def sparse(self) -> SparseValue:
        """As TF's VarLenFeature: indices (row, position), values, dense_shape [rows, longest row]. The indices in one
        C pass when the extension is built (``_records.sparse_indices``)."""
        lengths = self.lengths
        n, nnz = len(lengths), int(self.splits[-1] - self.splits[0])
        indices = np.empty((nnz, 2), dtype=np.int64)
        splits = np.ascontiguousarray(self.splits, dtype=np.int64)
        if native.records is not None and hasattr(native.records, "sparse_indices"):
            native.records.sparse_indices(splits, indices)
        else:
            indices[:, 0] = np.repeat(np.arange(n, dtype=np.int64), lengths)
            np.subtract(np.arange(nnz, dtype=np.int64), np.repeat(splits[:-1] - splits[0], lengths), out=indices[:, 1])
        width = int(lengths.max()) if n and nnz else 0
        return SparseValue(indices, self.flat(), np.array([n, width], dtype=np.int64))

    def dense(self, width: int, default: Any) -> np.ndarray:
        """[rows, width]: each row truncated to ``width`` values or padded with ``default``."""
        vals = self.flat()
        out = np.full((len(self), width), default, dtype=vals.dtype if vals.dtype != object else object)
        lengths = np.minimum(self.lengths, width)
        rows = np.repeat(np.arange(len(self)), lengths)
        starts = np.repeat(self.splits[:-1], lengths)
        cols = np.arange(len(rows)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[rows, cols] = self.values[starts + cols]
        return out


def concat(parts: Sequence[Any]) -> Any:
    """Concatenate row-wise: numpy arrays, or Ragged rows."""
    if not isinstance(parts[0], Ragged):
        return np.concatenate(parts)
    values = np.concatenate([p.flat() for p in parts])
    return Ragged.from_lengths(values, np.concatenate([p.lengths for p in parts]))


def finish(value: Any) -> Any:
    """A batch column as the model gets it: Ragged rows become a :class:`SparseValue`; arrays stay."""
    return value.sparse() if isinstance(value, Ragged) else value
