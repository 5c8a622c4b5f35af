r"""Scores evidence retrieval runs as the rows of the paper's Table 3; prints a markdown table.

  # A system's runs (TREC format, query id = claim_id, text doc ids = corpus_ids, image doc
  # ids = KB image file names):
  python scripts/evaluate_retrieval.py --release=DIR --split=test --system=SBERT \
      --text_run=text.run [--image_run=image.run] [--encoder=MINILM_DIR] \
      [--image_encoder=CLIP_DIR] [--k=5,10] [--out=rows.json]
  # The BM25 baseline: index the KB sentences, search the split's claims, score it:
  python scripts/evaluate_retrieval.py --release=DIR --split=test --bm25 \
      [--write_run=bm25.run] [--write_results=bm25_results.csv]

Rows: one per (system, modality, K): Rec@K Pre@K NDCG@K MAP@K, the un-cut TREC NDCG and
MAP, S-Rec@K and S-Pre@K (only with --encoder for text / --image_encoder for images).
Figures print in percent; --out writes the rows as JSON with fractions and the counts.
Claims without a relevant qrel are skipped and counted; claims a run lacks score 0.
A run naming a claim that is not in the split, or a document that is not in the KB, is an
error (it was made for another split or KB). Unusable input: one line on stderr, exit 1.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import sys
import time

from absl import app, flags

from mocheg_jax.data import mocheg
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.metrics import trec
from mocheg_jax.retrieval import bm25 as bm25_lib
from mocheg_jax.retrieval import results as results_lib
from mocheg_jax.retrieval import table3
from mocheg_jax.utils.cli import friendly_errors

_RELEASE = flags.DEFINE_string("release", None, "Mocheg release folder.", required=True)
_SPLIT = flags.DEFINE_enum("split", "test", list(mocheg.SPLITS), "Split whose claims are scored.")
_SYSTEM = flags.DEFINE_string("system", None, "System name in the table (default: BM25 with "
                              "--bm25, else 'system').")
_TEXT_RUN = flags.DEFINE_string("text_run", None, "TREC run of KB sentences per claim.")
_IMAGE_RUN = flags.DEFINE_string("image_run", None, "TREC run of KB images per claim.")
_K = flags.DEFINE_list("k", ["5", "10"], "Cut-offs K.")
_OUT = flags.DEFINE_string("out", None, "Write the rows here as JSON.")
_ENCODER = flags.DEFINE_string(
    "encoder", None, "Sentence-transformers/HF text model folder for text S-Recall.")
_IMAGE_ENCODER = flags.DEFINE_string(
    "image_encoder", None, "HF CLIP folder for image S-Recall (images encoded from files).")
_BM25 = flags.DEFINE_bool("bm25", False, "Build BM25 over the KB sentences and score it.")
_BM25_K1 = flags.DEFINE_float("bm25_k1", bm25_lib.DEFAULT_K1, "BM25 k1.", lower_bound=0.0)
_BM25_B = flags.DEFINE_float("bm25_b", bm25_lib.DEFAULT_B, "BM25 b.", lower_bound=0.0,
                             upper_bound=1.0)
_BM25_STOP_WORDS = flags.DEFINE_bool("bm25_stop_words", True, "Drop English stop words.")
_DEPTH = flags.DEFINE_integer(
    "depth", 100, "--bm25: documents retrieved per claim (the un-cut NDCG/MAP use them all).",
    lower_bound=1)
_WRITE_RUN = flags.DEFINE_string("write_run", None, "--bm25: write its TREC run here.")
_WRITE_RESULTS = flags.DEFINE_string(
    "write_results", None, "Write the retrieval result CSV (top max(K) per list) here, "
    "the system evidence the verification and explanation stages read.")


def _log(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _cutoffs() -> list[int]:
  try:
    ks = [int(k) for k in _K.value]
  except ValueError:
    ks = []
  if not ks or min(ks) < 1:
    raise MochegInputError(f"--k must be positive integers, got {','.join(_K.value)}")
  return ks


def _check_docs(run: dict, known, path: str, what: str) -> None:
  """A run whose documents are not in this KB was made for another one: refuse it."""
  unknown = sorted({doc for ranked in run.values() for doc, _ in ranked if doc not in known})
  if unknown:
    raise MochegInputError(f"{path}: {len(unknown)} retrieved {what} are not in the release's "
                           f"KB, e.g. {', '.join(unknown[:5])}")


def _load_sentences(release: mocheg.MochegRelease) -> dict[str, str]:
  start = time.perf_counter()
  sentences = {s.corpus_id: s.text for s in release.iter_sentences()}
  if not sentences:
    raise MochegInputError(f"{release.root}: the knowledge base has no sentences")
  _log(f"read {len(sentences):,} KB sentences in {time.perf_counter() - start:.1f}s")
  return sentences


def _bm25_run(sentences: dict[str, str], claims: list[mocheg.Claim]) -> dict:
  start = time.perf_counter()
  index = bm25_lib.BM25.build(list(sentences), sentences.values(), k1=_BM25_K1.value,
                              b=_BM25_B.value, stop_words=_BM25_STOP_WORDS.value,
                              progress=len(sentences) > 500_000)
  built = time.perf_counter()
  run = index.run({str(c.claim_id): c.claim for c in claims}, _DEPTH.value,
                  progress=len(claims) > 1000)
  done = time.perf_counter()
  _log(f"BM25 (k1={index.k1}, b={index.b}): indexed {index.num_docs:,} sentences "
       f"({index.num_terms:,} terms, {index.num_postings:,} postings) in {built - start:.1f}s; "
       f"searched {len(claims):,} claims in {done - built:.2f}s "
       f"({len(claims) / max(done - built, 1e-9):,.0f} claims/s)")
  return run


def _encoders(release: mocheg.MochegRelease) -> dict:
  semantic = {}
  if _ENCODER.value or _IMAGE_ENCODER.value:
    from mocheg_jax.models import encoding  # Heavy (jax, flax): only when asked.
    if _ENCODER.value:
      text_encoder = encoding.load_encoder(_ENCODER.value)
      semantic["text"] = lambda texts: text_encoder.encode_texts(texts)
    if _IMAGE_ENCODER.value:
      image_encoder = encoding.load_encoder(_IMAGE_ENCODER.value, images=True)
      semantic["image"] = lambda names: image_encoder.encode_images(
          [release.image_path(n) for n in names])
  return semantic


def evaluate() -> list[dict]:
  """Reads or builds the runs the flags name and returns their Table 3 rows."""
  ks = _cutoffs()
  if _BM25.value and _TEXT_RUN.value:
    raise MochegInputError("--bm25 makes the text run; do not also give --text_run")
  if not (_BM25.value or _TEXT_RUN.value or _IMAGE_RUN.value):
    raise MochegInputError("nothing to score: give --text_run and/or --image_run, or --bm25")
  if _WRITE_RUN.value and not _BM25.value:
    raise MochegInputError("--write_run writes the BM25 run; it needs --bm25")
  if _IMAGE_ENCODER.value and not _IMAGE_RUN.value:
    raise MochegInputError("--image_encoder needs --image_run")
  if _ENCODER.value and not (_TEXT_RUN.value or _BM25.value):
    raise MochegInputError("--encoder needs a text run (--text_run or --bm25)")
  release = mocheg.MochegRelease(_RELEASE.value)
  split = _SPLIT.value
  claims = release.claims(split)
  if not claims:
    raise MochegInputError(f"{release.path(split, mocheg.CLAIMS_FILE)}: no claims")
  system = _SYSTEM.value or ("BM25" if _BM25.value else "system")

  runs, qrels, texts = {}, {}, {}
  sentences: dict[str, str] = {}
  if _BM25.value or _TEXT_RUN.value:
    sentences = _load_sentences(release)
    if _BM25.value:
      runs["text"] = _bm25_run(sentences, claims)
      if _WRITE_RUN.value:
        trec.write_run(_WRITE_RUN.value, runs["text"], tag=system.replace(" ", "_"))
        _log(f"wrote the BM25 run to {_WRITE_RUN.value}")
    else:
      runs["text"] = trec.read_run(_TEXT_RUN.value)
      _check_docs(runs["text"], sentences, _TEXT_RUN.value, "sentences")
    qrels["text"] = trec.read_qrels(release.path(split, mocheg.TEXT_QRELS))
    texts["text"] = sentences
  if _IMAGE_RUN.value:
    runs["image"] = trec.read_run(_IMAGE_RUN.value)
    _check_docs(runs["image"], set(release.kb_images(clean=False)), _IMAGE_RUN.value,
                "images")
    qrels["image"] = trec.read_qrels(release.path(split, mocheg.IMAGE_QRELS))
  if release.report:
    _log(f"{release.root}: {release.report.summary()}")

  claim_ids = [str(c.claim_id) for c in claims]
  try:
    rows = table3.table3_rows(system, runs, qrels, ks, semantic=_encoders(release),
                              texts=texts, claim_ids=claim_ids)
  except ValueError as e:  # Ids of another split, or no qrels to score with.
    raise MochegInputError(f"{release.root} ({split}): {e}") from None

  if _WRITE_RESULTS.value:
    rows_out = results_lib.results_from_runs(
        [c.claim_id for c in claims], runs.get("text"), sentences, runs.get("image"),
        k=max(ks))
    results_lib.write_results(_WRITE_RESULTS.value, rows_out)
    _log(f"wrote retrieval results for {len(rows_out)} claims to {_WRITE_RESULTS.value}")
  return rows


@friendly_errors
def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  rows = evaluate()
  for line in table3.count_lines(rows):
    _log(line)
  print(table3.format_table(rows))
  if _OUT.value:
    table3.write_rows(_OUT.value, rows)
    _log(f"wrote {len(rows)} rows to {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
