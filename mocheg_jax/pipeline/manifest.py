"""A pipeline folder's manifest: which trained stages and indexes make the fact-checker.

The main job writes `PIPELINE_DIR/manifest.json` once every stage has finished; the
fact-checker (`pipeline.fact_checker`) reads it. Paths in it are relative to the folder,
which also records where it was written (`written_at`): a folder copied elsewhere is read
with `Manifest.moved`, so the absolute paths saved inside it (training configs, index and
feature-store fingerprints) are relocated to where it is now (utils/paths.py).
Reading checks every named stage is a finished training run and every index exists, so a
folder missing a stage fails at load time with the stage's name and path, not midway
through checking a claim.
"""

from __future__ import annotations

import dataclasses
import json
import os

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.retrieval import index as index_lib
from mocheg_jax.train.loop import CHECKPOINT_DIR
from mocheg_jax.utils import files, paths

MANIFEST = "manifest.json"
FORMAT = 1

# The stages the fact-checker runs, in order, and the main job's folder of each.
# The generator is the NLL one: on the small world the REINFORCE generator is no better
# (README Table 5: classifier agreement 97.5% against 97.0%, not significant; ROUGE-L 40.0
# against 40.1), and an earlier reward recipe collapsed it to 9-14 distinct texts.
STAGES = {
    "text_retriever": "stages/retrieval_text",
    "reranker": "stages/rerank",
    "image_retriever": "stages/retrieval_image",
    "verifier": "stages/verify_text_image",
    "generator": "stages/explain_nll",
}
INDEXES = {"text": "index/text", "image": "index/image"}
RELEASE = "release"  # The KB's sentence texts and image files (or an absolute path).


@dataclasses.dataclass(frozen=True)
class Settings:
  """How much evidence each step keeps (the main job's system settings)."""
  text_candidates: int = 100  # Bi-encoder hits the cross-encoder reorders.
  text_top_k: int = 10  # Reranked sentences reported per claim.
  image_top_k: int = 10  # KB images reported per claim.
  verifier_texts: int = 5  # Of those, what the verifier reads (verification's system
  verifier_images: int = 5  # evidence: evidence.system_evidence's defaults).
  generator_texts: int = 5  # Sentences the generator reads (explanation.inputs.TOP_TEXT).
  # How the text hits are ordered: the bi-encoder's and the cross-encoder's scores fused
  # (retrieval/fusion.py), 1 the cross-encoder's order (the paper's), 0 the bi-encoder's
  # (no reranking). The main job sets what did best on dev (retrieval.stage
  # .choose_text_system), so that the checker reads the evidence the tables scored.
  rerank_weight: float = 1.0
  # The image search grounded on the text evidence: the images of the articles of the top
  # N text hits first (retrieval/grounding.py); 0: the paper's global CLIP ranking. The main
  # job sets what did best on dev (retrieval.stage.choose_image_system).
  image_articles: int = 0
  # jax_default_matmul_precision the job ran under ("": JAX's default), so the checker
  # computes as the main job did ("bfloat16": bfloat16 products on CPU too, models/matmul.py).
  matmul_precision: str = ""

  def __post_init__(self):
    weight = self.rerank_weight
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= 1:
      raise ValueError(f"Settings.rerank_weight must be a number in [0, 1], got {weight!r}")
    if not isinstance(self.matmul_precision, str):
      raise ValueError(f"Settings.matmul_precision must be a string, got "
                       f"{self.matmul_precision!r}")
    for field in dataclasses.fields(self):
      if field.name in ("rerank_weight", "matmul_precision"):
        continue
      least = 0 if field.name == "image_articles" else 1
      if getattr(self, field.name) < least:
        raise ValueError(f"Settings.{field.name} must be >= {least}, got "
                         f"{getattr(self, field.name)}")


@dataclasses.dataclass(frozen=True)
class Manifest:
  """A pipeline folder's parts as absolute paths (`read_manifest`)."""
  root: str
  release: str
  stages: dict[str, str]
  indexes: dict[str, str]
  settings: Settings
  scale: str = ""
  seed: int = 0
  # (root as written, root now) when the folder was read from elsewhere than where the main
  # job wrote it; None when read in place or when the manifest predates `written_at`.
  moved: paths.Moved = None


def write_manifest(pipeline_dir: str, *, scale: str, seed: int, release: str = "",
                   settings: Settings = Settings(), moved: paths.Moved = None,
                   verifier: str = STAGES["verifier"]) -> str:
  """Writes the main job's manifest (atomically) and returns its path; every part must
  exist already (checked by reading it back). `release`: the release folder the pipeline
  was trained on, when not the synthetic world in PIPELINE_DIR/release. `moved`: the job
  reran in a folder moved since it was first written (`recorded_move`); the records kept
  from then still name the old root, so the manifest keeps it as `written_at` (records
  written now, under the new root, relocate to themselves). `verifier`: the folder (relative
  to the pipeline's) of the verifier that wrote the system labels, when not the text+image
  one (verification.stage.choose_system_verifier)."""
  root = os.path.abspath(pipeline_dir)
  if release:
    release = os.path.abspath(release)
    if release == root or release.startswith(root + os.sep):
      release = os.path.relpath(release, root)  # Inside the folder: moves with it.
  data = {"format": FORMAT, "scale": scale, "seed": seed,
          "written_at": moved[0] if moved else root,
          "release": release or RELEASE,
          "stages": {**STAGES, "verifier": verifier}, "indexes": dict(INDEXES),
          "settings": dataclasses.asdict(settings)}
  path = os.path.join(pipeline_dir, MANIFEST)
  files.write_json(path, data, indent=2)
  read_manifest(pipeline_dir)
  return path


def recorded_move(pipeline_dir: str) -> paths.Moved:
  """(old root, new root) when `pipeline_dir` holds a manifest written elsewhere (the folder
  was copied since), else None. Reads only `written_at`, so a folder whose stages are being
  retrained still answers."""
  path = os.path.join(pipeline_dir, MANIFEST)
  try:
    with open(path) as f:
      written_at = json.load(f).get("written_at")
  except FileNotFoundError:
    return None
  except (OSError, json.JSONDecodeError, AttributeError) as e:
    raise MochegInputError(f"{path}: unreadable manifest ({e})") from None
  return paths.moved_root(written_at, pipeline_dir) if isinstance(written_at, str) else None


def _relative_paths(data: dict, key: str, names: dict, path: str) -> dict[str, str]:
  section = data.get(key)
  if not isinstance(section, dict):
    raise MochegInputError(f"{path}: {key!r} must be an object naming {sorted(names)}")
  missing = sorted(set(names) - set(section))
  if missing:
    raise MochegInputError(f"{path}: {key} lacks {missing} (a pipeline needs {sorted(names)})")
  for name, value in section.items():
    if not isinstance(value, str) or not value:
      raise MochegInputError(f"{path}: {key}.{name} must be a folder path, got {value!r}")
  return {name: section[name] for name in names}


def _current_settings(settings: dict) -> dict:
  """Settings as written before the fused ranking: `rerank` true / false is weight 1 / 0."""
  if isinstance(settings, dict) and "rerank" in settings and "rerank_weight" not in settings:
    settings = dict(settings)
    rerank = settings.pop("rerank")
    if not isinstance(rerank, bool):
      raise ValueError(f"Settings.rerank must be true or false, got {rerank!r}")
    settings["rerank_weight"] = 1.0 if rerank else 0.0
  return settings


def read_manifest(pipeline_dir: str) -> Manifest:
  """The manifest of `pipeline_dir`, every part checked to be there.

  Raises:
    MochegInputError: no folder or manifest, malformed JSON, an unknown format, a stage
      that is not a finished training run, a missing index or release (each named).
  """
  root = os.path.abspath(pipeline_dir)
  if not os.path.isdir(root):
    raise MochegInputError(f"{pipeline_dir}: no such pipeline folder")
  path = os.path.join(root, MANIFEST)
  if not os.path.isfile(path):
    raise MochegInputError(f"{path}: missing; a pipeline folder is what "
                           "scripts/run_pipeline.py writes (its --workdir) once every stage "
                           "has finished")
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise MochegInputError(f"{path}: unreadable manifest ({e})") from None
  if not isinstance(data, dict) or data.get("format") != FORMAT:
    raise MochegInputError(f"{path}: not a format-{FORMAT} pipeline manifest")
  stages = _relative_paths(data, "stages", STAGES, path)
  indexes = _relative_paths(data, "indexes", INDEXES, path)
  try:
    settings = Settings(**_current_settings(data.get("settings", {})))
  except (TypeError, ValueError) as e:
    raise MochegInputError(f"{path}: bad settings ({e})") from None

  def checked(kind: str, name: str, relative: str, marker: str, what: str) -> str:
    where = os.path.join(root, relative)
    if not os.path.exists(os.path.join(where, marker)):
      raise MochegInputError(f"{path}: {kind} {name!r} ({where}) is missing or unfinished "
                             f"(no {marker}: {what})")
    return where

  written_at = data.get("written_at")
  moved = paths.moved_root(written_at, root) if isinstance(written_at, str) else None
  release = data.get("release")
  if isinstance(release, str):  # An absolute release inside the folder moved with it.
    release = paths.relocate(release, moved)
  if not isinstance(release, str) or not os.path.isdir(os.path.join(root, release)):
    raise MochegInputError(f"{path}: the release folder {release!r} is missing")
  return Manifest(
      root=root, release=os.path.join(root, release), moved=moved,
      stages={n: checked("stage", n, r, CHECKPOINT_DIR, "not a training run")
              for n, r in stages.items()},
      indexes={n: checked("index", n, r, index_lib.MANIFEST_FILE, "not a finished index")
               for n, r in indexes.items()},
      settings=settings, scale=str(data.get("scale", "")), seed=int(data.get("seed", 0)))
