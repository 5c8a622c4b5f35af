"""`write_world`: a complete synthetic Mocheg release folder, deterministic per seed.

Steps: plan the facts and claims (`knowledge`), plan every claim's articles and images
(`articles.plan_claims`), start rendering the images (worker processes for large worlds),
stream the text of one claim at a time into the CSV files (`writer`), wait for the images.
The same (scale, seed) always gives byte-identical files, whatever the number of workers.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time

from mocheg_jax.data.synthetic import articles
from mocheg_jax.data.synthetic import knowledge as knowledge_lib
from mocheg_jax.data.synthetic import ruling
from mocheg_jax.data.synthetic import scales
from mocheg_jax.data.synthetic import writer as writer_lib
from mocheg_jax.data.synthetic.rng import rng_for
from mocheg_jax.utils.progress import Progress

# Below this many images, worker processes cost more to start than they save.
_MIN_IMAGES_FOR_WORKERS = 4_000
_RELEASE_ENTRIES = ("Corpus3.csv", "images", "supplementary", *scales.SPLITS)


@dataclasses.dataclass(frozen=True)
class WorldSummary:
  """What `write_world` wrote."""
  root: str
  scale: str
  seed: int
  claims: dict[str, int]                 # split -> claims
  labels: dict[str, dict[str, int]]      # split -> {"refuted": n, "supported": n, "NEI": n}
  text_evidence: dict[str, int]          # split -> evidence sentences (text qrels rows)
  image_evidence: dict[str, int]         # split -> proof images (image qrels rows)
  articles: int
  evidence_articles: int                 # articles holding some claim's evidence
  sentences: int
  kb_images: int                         # KB image files (junk included, proofs excluded)
  junk_images: int                       # KB images the cleaning rules drop
  image_only_claims: int                 # supported/refuted claims about image-only facts
  empty_rulings: int                     # claims with an empty `ruling_outline`
  image_files: int                       # all image files written (twins and copies too)
  seconds: float

  @property
  def total_claims(self) -> int:
    return sum(self.claims.values())

  def lines(self) -> list[str]:
    out = [f"synthetic Mocheg world: scale={self.scale} seed={self.seed} at {self.root}"]
    for split in scales.SPLITS:
      lab = self.labels[split]
      out.append(
          f"  {split:5s}: {self.claims[split]:,} claims (refuted {lab.get('refuted', 0):,} / "
          f"supported {lab.get('supported', 0):,} / NEI {lab.get('NEI', 0):,}), "
          f"{self.text_evidence[split]:,} text evidence, {self.image_evidence[split]:,} "
          "image evidence")
    out.append(f"  KB: {self.articles:,} articles ({self.evidence_articles:,} with evidence), "
               f"{self.sentences:,} sentences, {self.kb_images:,} images "
               f"({self.junk_images:,} junk)")
    out.append(f"  {self.image_only_claims:,} claims need an image to verify; "
               f"{self.empty_rulings:,} empty ruling outlines; {self.image_files:,} image "
               f"files; {self.seconds:.1f} s")
    return out


def _prepare(out_dir: str, overwrite: bool) -> None:
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    if not overwrite:
      raise FileExistsError(f"{out_dir} is not empty; pass overwrite=True to replace the "
                            "release in it")
    for entry in _RELEASE_ENTRIES:  # Only the release's own files; nothing else.
      path = os.path.join(out_dir, entry)
      if os.path.isdir(path):
        shutil.rmtree(path)
      elif os.path.exists(path):
        os.remove(path)
  os.makedirs(out_dir, exist_ok=True)
  writer_lib.make_directories(out_dir)


def write_world(out_dir: str | os.PathLike, scale: str = "tiny", seed: int = 0,
                workers: int | None = None, progress: bool = True, *,
                overwrite: bool = False) -> WorldSummary:
  """Writes a complete synthetic release into `out_dir`.

  Args:
    out_dir: release root; must be empty or missing unless `overwrite`.
    scale: a preset of `scales.SCALES` ("tiny", "small", "paper").
    seed: world seed; the same (scale, seed) gives byte-identical files.
    workers: image worker processes; None picks the CPU count for large worlds and renders
      in-process for small ones; 0 or 1 renders in-process.
    progress: print progress with ETA to stderr.
    overwrite: replace an existing release in `out_dir` (only the release's own entries
      are deleted).

  Returns:
    A `WorldSummary` of what was written.
  """
  start = time.monotonic()
  preset = scales.get_scale(scale)
  root = os.fspath(out_dir)
  _prepare(root, overwrite)
  knowledge = knowledge_lib.build_knowledge(preset, seed)
  plans = articles.plan_claims(knowledge, preset, seed, progress=progress)
  jobs = [image.job for plan in plans for image in plan.images]
  if workers is None:
    workers = (os.cpu_count() or 1) if len(jobs) >= _MIN_IMAGES_FOR_WORKERS else 0
  renderer = writer_lib.ImageRenderer(root, jobs, workers, progress)
  try:
    with writer_lib.ReleaseWriter(root) as out, Progress(
        "claims (text)", total=len(plans), unit="claim", enabled=progress) as bar:
      for plan in plans:
        texts = articles.compose(plan, knowledge, seed)
        evidence = [t.sentences[i] for t in texts for i in t.evidence_positions]
        fields = ruling.claim_fields(plan.claim, knowledge, evidence, seed)
        out.write_claim(plan, texts, fields, rng_for(seed, "rows", plan.claim.claim_id))
        bar.update()
    image_files = renderer.finish()
  except BaseException:
    renderer.abort()
    raise
  c = out.counts
  return WorldSummary(
      root=root, scale=preset.name, seed=seed,
      claims={s: c[f"claims/{s}"] for s in scales.SPLITS},
      labels={s: dict(out.labels[s]) for s in scales.SPLITS},
      text_evidence={s: c[f"text_evidence/{s}"] for s in scales.SPLITS},
      image_evidence={s: c[f"image_evidence/{s}"] for s in scales.SPLITS},
      articles=c["articles"], evidence_articles=c["evidence_articles"],
      sentences=c["sentences"], kb_images=c["kb_images"], junk_images=c["junk_images"],
      image_only_claims=c["image_only_claims"], empty_rulings=c["empty_rulings"],
      image_files=image_files, seconds=time.monotonic() - start)
