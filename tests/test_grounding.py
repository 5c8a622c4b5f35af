"""Image search grounded on the articles of the text evidence (retrieval/grounding.py)."""

import numpy as np
import pytest

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.metrics import trec
from mocheg_jax.retrieval import grounding
from mocheg_jax.retrieval import index as index_lib
from mocheg_jax.retrieval import system

IMAGES = ["00003-00018-01-a.jpg", "00003-00018-02-b.jpg", "00007-00040-01-c.jpg",
          "00009-00051-03-d.jpg", "00009-00052-01-e.jpg"]


def test_articles_of_the_text_hits_are_distinct_and_best_first():
  hits = [("3-18-2", 0.9), ("9-51-0", 0.8), ("3-18-5", 0.7), ("7-40-1", 0.6), ("9-52-4", 0.5)]
  assert grounding.hit_articles(hits, 2) == [(3, 18), (9, 51)]
  assert grounding.hit_articles(hits, 10) == [(3, 18), (9, 51), (7, 40), (9, 52)]
  assert grounding.hit_articles(hits, 0) == []


@pytest.mark.parametrize("bad", ["3-18", "3-x-1", "proof"])
def test_a_text_id_that_names_no_article_is_refused(bad):
  with pytest.raises(MochegInputError, match=bad):
    grounding.sentence_article(bad)


def _unit(rows):
  rows = np.asarray(rows, np.float32)
  return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _image_index(tmp_path, embeddings, ids=IMAGES, kind="image"):
  with index_lib.IndexWriter(tmp_path / "index", kind, 2, {"name": "toy"}) as writer:
    writer.add(ids, embeddings)
  return index_lib.EmbeddingIndex.open(tmp_path / "index")


def test_images_are_grouped_by_article(tmp_path):
  index = _image_index(tmp_path, _unit(np.ones((5, 2))))
  assert grounding.Grounder(index).rows_of([(9, 51), (3, 18), (1, 1)]) == [3, 0, 1]
  assert index.gather([3, 0]).shape == (2, 2)


def test_a_proof_image_or_a_text_index_is_refused(tmp_path):
  with pytest.raises(MochegInputError, match="00003-proof-00-x.jpg"):
    grounding.Grounder(_image_index(tmp_path / "a", _unit([[1, 0]]), ["00003-proof-00-x.jpg"]))
  with pytest.raises(MochegInputError, match="holds texts"):
    grounding.Grounder(_image_index(tmp_path / "b", _unit([[1, 0]]), ["3-18-1"], "text"))


def test_grounded_images_come_first_by_cosine_then_the_global_ranking_without_repeats(
    tmp_path):
  embeddings = _unit([[0.6, 0.8], [1, 0], [0, 1], [1, 1], [-1, 0]])
  ground = grounding.Grounder(_image_index(tmp_path, embeddings))
  query = _unit([[1, 0]])[0]
  global_hits = [("00009-00052-01-e.jpg", 0.9), ("00003-00018-01-a.jpg", 0.6),
                 ("00007-00040-01-c.jpg", 0.5)]
  text_hits = [("3-18-4", 0.8), ("7-40-0", 0.7)]  # Article (3, 18) holds images 0 and 1.
  hits = ground(query, text_hits, global_hits, articles=1, k=4)
  assert [name for name, _ in hits] == ["00003-00018-02-b.jpg", "00003-00018-01-a.jpg",
                                        "00009-00052-01-e.jpg", "00007-00040-01-c.jpg"]
  assert [s for _, s in hits[:2]] == pytest.approx([1 + grounding.GROUNDED_BONUS,
                                                    0.6 + grounding.GROUNDED_BONUS])
  # The scores alone keep the order: a run file read back is re-sorted by score.
  assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
  assert ground(query, text_hits, global_hits, articles=1, k=1) == hits[:1]
  assert [n for n, _ in ground(query, text_hits, global_hits, articles=2, k=4)][:3] == \
      ["00003-00018-02-b.jpg", "00003-00018-01-a.jpg", "00007-00040-01-c.jpg"]
  assert ground(query, text_hits, global_hits, articles=0, k=2) == global_hits[:2]
  assert ground(query, [("5-1-0", 1.0)], global_hits, articles=3, k=2) == global_hits[:2]


def test_a_run_grounded_on_a_text_run_survives_a_run_file(tmp_path):
  embeddings = _unit([[0.2, 1], [1, 0.3], [1, 0.05], [1, 0], [1, 0.02]])
  index = _image_index(tmp_path, embeddings)
  query = _unit([[1, 0]])[0]
  global_run = {"5": [(IMAGES[2], 1.0), (IMAGES[4], 0.99)]}
  text_run = {"5": [("9-51-0", 0.7), ("3-18-1", 0.6), ("3-18-2", 0.5)]}
  run = system._grounded(global_run, {"5": query}, index, system.Grounding(text_run, 2), k=4)
  assert [name for name, _ in run["5"]] == [IMAGES[3], IMAGES[1], IMAGES[0], IMAGES[2]]
  trec.write_run(tmp_path / "image.run", run, "grounded")
  assert [d for d, _ in trec.read_run(tmp_path / "image.run")["5"]] == \
      [name for name, _ in run["5"]]
  with pytest.raises(MochegInputError, match="claim 5: no text evidence"):
    system._grounded(global_run, {"5": query}, index, system.Grounding({}, 1), k=2)
