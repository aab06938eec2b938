"""Synthetic inputs for a data-free refinement: smooth-noise images, or text the two end models write themselves.

`full_symmetry_synthetic` (matching.refine=synthetic) refines the whole symmetry as `full_symmetry_learned`
does (matching/learned.py), distilled only: each step's target is the two end models' own predictions on inputs
made here, so no data is read. Labels are made too (the model's own loss needs them) and never read.
- Image models: N(0, 1) noise blurred twice by a box BLUR x the image side wide (zero padding; 13 pixels at 28),
  standardised per image and channel: mean 0, variance 1, as the tasks' preprocessing hands their images to the
  model (pipeline/data/images.py). The width was chosen on the validation split of the mini's three ViT pairs
  among 5, 9, 13 and 19 pixels at 28; unblurred noise made the barrier worse than no refinement (docs/matching.md).
- Causal language models: sequences of TEXT_LENGTH tokens (at most the model's positions less one) sampled at
  temperature 1 from the first special token, batch i written by end model i mod n of the n given (a pair: the
  anchor for even i, the source for odd i; k models of align_many: each writes every k-th batch),
  each writer's batches CALL at a time (one generate call writes CALL x SEQUENCES rows: 3x faster than a call
  per batch on the mini decoders, whose token steps cost little beside a call's fixed work).
Models that neither read images nor generate text (encoder classifiers) are refused with one line.
Batch i is made from a generator seeded by `seed` and i (text: by `seed`, its writer and its call): the same on
every read, in any order. Images are made when read and never held (any image size); text, slow to write and
small, is written once and kept.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch

from symfusion.errors import SymfusionError
from symfusion.families import family_spec, token_limit

BLUR = 13 / 28              # the box's width as a fraction of the image side (rounded to an odd number of pixels)
IMAGES = 64                 # images per batch (the mini's statistic batches)
SEQUENCES, TEXT_LENGTH = 8, 128     # sequences per batch and tokens per sequence (the mini decoders' blocks)
CALL = 8                    # text batches one writer writes in one generate call


def check_inputs(model: torch.nn.Module) -> str:
    """"images" or "text": what can be made for `model`; a model that reads no images and writes no text is
    refused with one line (there is nothing this module can make for it)."""
    if family_spec(model.config).inputs == "pixels":
        return "images"
    if model.can_generate():
        return "text"
    raise SymfusionError(f"matching.refine=synthetic makes images or text a causal LM writes; {type(model).__name__} "
                         "reads text it cannot write: give data instead (matching=full_symmetry_learned data_task=NAME)")


def box_width(side: int) -> int:
    """The blur box's width in pixels for images `side` pixels wide: BLUR x side, the nearest odd number."""
    return max(1, 2 * round((BLUR * side - 1) / 2) + 1)


def smooth_noise(shape: tuple[int, int, int, int], generator: torch.Generator) -> torch.Tensor:
    """Images (batch, channels, height, width) of N(0, 1) noise blurred twice by the box (each direction apart:
    the same box), standardised per image and channel."""
    x = torch.randn(shape, generator=generator)
    channels, k = shape[1], box_width(max(shape[2:]))
    rows = torch.full((channels, 1, k, 1), 1 / k)
    cols = torch.full((channels, 1, 1, k), 1 / k)
    for _ in range(2):
        x = torch.nn.functional.conv2d(x, rows, padding=(k // 2, 0), groups=channels)
        x = torch.nn.functional.conv2d(x, cols, padding=(0, k // 2), groups=channels)
    centred = x - x.mean((2, 3), keepdim=True)
    return centred / centred.pow(2).mean((2, 3), keepdim=True).sqrt().clamp_min(1e-12)


@torch.no_grad()
def sampled_text(model: torch.nn.Module, rows: int, length: int, seed: int) -> torch.Tensor:
    """(rows, length) token ids that `model` writes from its first special token in the vocabulary (else id 0) at
    temperature 1, seeded."""
    config = model.config
    special = (config.bos_token_id, config.eos_token_id, config.pad_token_id)
    start_id = next((i for i in special if isinstance(i, int) and 0 <= i < config.vocab_size), 0)  # in the vocabulary
    start = torch.full((rows, 1), int(start_id), dtype=torch.long)
    with torch.random.fork_rng(devices=[]):                      # generate() draws from the global generator
        torch.manual_seed(seed)
        ids = model.generate(input_ids=start, attention_mask=torch.ones_like(start), do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=length, min_new_tokens=length,
                             pad_token_id=int(start_id))
    return ids[:, 1:]


class SyntheticBatches(Sequence):
    """`count` batches of synthetic inputs for `model` (a module of the models' architecture); `states`: the end
    models' state dicts (the anchor's and the source's, or the k of align_many), which write the text of a causal LM
    in turn (images need none)."""

    def __init__(self, model: torch.nn.Module, states: Sequence[Mapping], count: int, seed: int = 0):
        self.kind, self.count, self.seed = check_inputs(model), count, seed
        config = model.config
        if self.kind == "images":
            self.shape = (IMAGES, config.num_channels, config.image_size, config.image_size)
            self.labels = max(int(getattr(config, "num_labels", 2)), 1)
        else:
            limit = token_limit(config)
            self.length = TEXT_LENGTH if limit is None else min(TEXT_LENGTH, limit - 1)
            self.writers, self.written = [], {}
            for state in states:                                    # each writes every n-th batch
                writer = copy.deepcopy(model).float().eval()
                writer.load_state_dict(dict(state))
                self.writers.append(writer)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.count))]
        if not -self.count <= index < self.count:
            raise IndexError(index)
        index %= self.count
        if self.kind == "text":                   # slow to write, small to hold: each batch written once
            n = len(self.writers)
            writer, place = index % n, index // n                     # the writer's place-th batch
            call = (writer, place // CALL)
            if call not in self.written:                              # the call's CALL batches, rows in order
                rows = min(CALL, (self.count - writer + n - 1) // n - call[1] * CALL) * SEQUENCES
                self.written[call] = sampled_text(self.writers[writer], rows, self.length,
                                                  self.seed * 1_000_003 + n * call[1] + writer)
            ids = self.written[call][(place % CALL) * SEQUENCES:(place % CALL + 1) * SEQUENCES]  # (SEQUENCES, length)
            return {"input_ids": ids, "labels": ids.clone()}
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        pixels = smooth_noise(self.shape, generator)
        return {"pixel_values": pixels, "labels": torch.randint(0, self.labels, self.shape[:1], generator=generator)}


def inputs_of(batches) -> str:
    """What a refinement ran on, as its report's `inputs` says: data, or these synthetic batches' kind."""
    return f"synthetic {batches.kind} (matching/synthetic.py)" if isinstance(batches, SyntheticBatches) else "data"
