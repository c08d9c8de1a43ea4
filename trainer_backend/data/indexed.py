"""Samples with their dataset index: the per-sample noise seed (families/objectives.py), so a
sample draws the same noise in any batch, accumulation group or process."""
from __future__ import annotations

import torch

from . import collate


class IndexedDataset(torch.utils.data.Dataset):
    """The dataset's samples plus their index: the per-sample noise seed (see families/objectives.py)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[int, dict]:
        return i, self.dataset[i]


def collate_with_index(pairs: list[tuple[int, dict]]) -> dict:
    batch = collate([sample for _, sample in pairs])
    batch["index"] = torch.tensor([i for i, _ in pairs])
    return batch
