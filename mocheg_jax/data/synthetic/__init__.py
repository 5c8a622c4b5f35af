"""A deterministic synthetic Mocheg world, written in the exact release layout.

The project's embedded default dataset: `write_world(out_dir, scale, seed)` writes a
release folder (see /work/shared/MOCHEG_FORMAT.md) with claims, a knowledge base of
articles, sentences and images, and qrels, at sizes from "tiny" (tests) to "paper" (the
published release's sizes). Modules: `scales` (size presets), `lexicon` (words and names),
`values` and `attributes` (facts and their phrasing), `knowledge` (entities, claims,
labels), `sentences` (KB sentences and the splitter's hard cases), `articles` (each claim's
articles, evidence and images), `ruling` (claim fields and explanations), `render`
(pictures), `writer` (files on disk), `world` (`write_world`).
"""

from mocheg_jax.data.synthetic.scales import SCALES, get_scale
from mocheg_jax.data.synthetic.sentences import SPLITTER_HARD_CASES
from mocheg_jax.data.synthetic.world import WorldSummary, write_world

__all__ = ["SCALES", "SPLITTER_HARD_CASES", "WorldSummary", "get_scale", "write_world"]
