"""The synthetic Mocheg world: exact release layout, consistency, difficulty, determinism.

Everything runs on the "tiny" scale (about 100 claims, a second or two per build).
"""

from __future__ import annotations

import collections
import csv
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from mocheg_jax.data import images as image_names
from mocheg_jax.data import labels
from mocheg_jax.data.report import SkipReport
from mocheg_jax.data.synthetic import SPLITTER_HARD_CASES, get_scale, write_world
from mocheg_jax.data.synthetic import articles, knowledge, lexicon, scales
from mocheg_jax.data.synthetic.sentences import check_sentence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLITS = ("train", "val", "test")
CORPUS2_HEADER = ["claim_id", "Snopes URL", "Category", "Headline", "Description", "Source",
                  "Claim", "Truthfulness", "Evidence", "evidence_id", "Origin",
                  "cleaned_truthfulness", "ruling_outline"]
QREL_HEADER = ["TOPIC", "ITERATION", "DOCUMENT#", "RELEVANCY"]
csv.field_size_limit(1 << 30)


def _read(path: str) -> tuple[list[str], list[list[str]]]:
  with open(path, newline="", encoding="utf-8") as f:
    rows = list(csv.reader(f))
  return rows[0], rows[1:]


def _dicts(path: str) -> list[dict[str, str]]:
  with open(path, newline="", encoding="utf-8") as f:
    return list(csv.DictReader(f))


def _all_files(root: str) -> dict[str, bytes]:
  out = {}
  for dirpath, _, files in os.walk(root):
    for name in files:
      path = os.path.join(dirpath, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = f.read()
  return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("world") / "release")
  summary = write_world(root, "tiny", seed=0, workers=0, progress=False)
  return root, summary


@pytest.fixture(scope="module")
def plan():
  """The generator's own plan of the same world (ground truth the files must match)."""
  scale = get_scale("tiny")
  know = knowledge.build_knowledge(scale, 0)
  return know, articles.plan_claims(know, scale, 0)


@pytest.fixture(scope="module")
def sentences(world):
  root, _ = world
  return {r["corpus_id"]: r for r in _dicts(
      os.path.join(root, "supplementary", "Corpus3_sentence_level.csv"))}


@pytest.fixture(scope="module")
def claims(world):
  """split -> claim_id -> its Corpus2 rows."""
  root, _ = world
  out = {}
  for split in SPLITS:
    by_claim = collections.defaultdict(list)
    for row in _dicts(os.path.join(root, split, "Corpus2.csv")):
      by_claim[int(row["claim_id"])].append(row)
    out[split] = dict(by_claim)
  return out


# ---- layout -----------------------------------------------------------------------------
def test_layout_and_headers(world):
  root, _ = world
  assert sorted(os.listdir(root)) == ["Corpus3.csv", "images", "supplementary", "test",
                                      "train", "val"]
  assert _read(os.path.join(root, "Corpus3.csv"))[0] == [
      "claim_id", "relevant_document_id", "Snopes URL", "Link URL", "Archive Url",
      "Origin Document"]
  assert _read(os.path.join(root, "supplementary", "Corpus3_sentence_level.csv"))[0] == [
      "claim_id", "relevant_document_id", "paragraph_id", "corpus_id", "paragraph"]
  for split in SPLITS:
    assert sorted(os.listdir(os.path.join(root, split))) == [
        "Corpus2.csv", "images", "img_evidence_qrels.csv",
        "text_evidence_qrels_article_level.csv", "text_evidence_qrels_sentence_level.csv"]
    assert _read(os.path.join(root, split, "Corpus2.csv"))[0] == CORPUS2_HEADER
    for name in ("text_evidence_qrels_sentence_level.csv",
                 "text_evidence_qrels_article_level.csv"):
      assert _read(os.path.join(root, split, name))[0] == QREL_HEADER
    assert _read(os.path.join(root, split, "img_evidence_qrels.csv"))[0] == (
        QREL_HEADER + ["evidence_id"])


def test_csv_dialect(world):
  root, _ = world
  with open(os.path.join(root, "train", "Corpus2.csv"), "rb") as f:
    data = f.read()
  assert b"\r\n" not in data  # "\n" line endings
  data.decode("utf-8")
  # QUOTE_MINIMAL: a field without special characters is not quoted.
  first = data.split(b"\n", 2)[1]
  assert not first.startswith(b'"')


# ---- articles and sentences -------------------------------------------------------------
def test_corpus_ids_and_articles(world, sentences):
  root, summary = world
  articles_rows = _dicts(os.path.join(root, "Corpus3.csv"))
  assert len(articles_rows) == summary.articles
  assert len(sentences) == summary.sentences
  docs = {(int(r["claim_id"]), int(r["relevant_document_id"])): r for r in articles_rows}
  assert len(docs) == len(articles_rows)
  assert len({d for _, d in docs}) == len(docs)  # document ids are unique
  per_doc = collections.defaultdict(list)
  for cid_text, row in sentences.items():
    cid, did, pid = int(row["claim_id"]), int(row["relevant_document_id"]), int(
        row["paragraph_id"])
    assert cid_text == f"{cid}-{did}-{pid}"
    assert row["claim_id"] == str(cid) and row["paragraph_id"] == str(pid)  # unpadded
    per_doc[(cid, did)].append((pid, row["paragraph"]))
  assert set(per_doc) == set(docs)
  for key, items in per_doc.items():
    assert [p for p, _ in items] == list(range(len(items)))  # 0-based, contiguous
    document = docs[key]["Origin Document"]
    assert document.startswith("<p>") and document.endswith("</p>")
    plain = " ".join(re.sub(r"</?p>", " ", document).split())
    assert plain == " ".join(s for _, s in items)  # the sentences, in order, nothing else


def test_sentences_follow_splitter_rules(sentences):
  for row in sentences.values():
    check_sentence(row["paragraph"])
  text = " ".join(r["paragraph"] for r in sentences.values())
  for needle in ("Dr. ", "Mr. ", "St. ", "U.S. ", "No. ", "$", '."', ". R. "):
    assert needle in text, f"hard case {needle!r} never used"
  assert re.search(r"\d\.\d", text)  # decimals


def test_splitter_hard_cases_are_documented():
  assert len(SPLITTER_HARD_CASES) >= 8
  for case, sents in SPLITTER_HARD_CASES:
    assert sents, case
    for s in sents:
      check_sentence(s)
  with pytest.raises(ValueError):
    check_sentence("He moved to the U.S.")  # a sentence may not end with an acronym
  with pytest.raises(ValueError):
    check_sentence("lower-case start.")


# ---- claims and qrels -------------------------------------------------------------------
def test_text_qrels_and_evidence_rows(world, sentences, claims):
  root, summary = world
  for split in SPLITS:
    qrels = collections.defaultdict(list)
    for row in _dicts(os.path.join(root, split, "text_evidence_qrels_sentence_level.csv")):
      assert (row["ITERATION"], row["RELEVANCY"]) == ("0", "1")
      assert row["DOCUMENT#"] in sentences, row
      assert sentences[row["DOCUMENT#"]]["claim_id"] == row["TOPIC"]  # the claim's own docs
      qrels[int(row["TOPIC"])].append(row["DOCUMENT#"])
    assert sum(map(len, qrels.values())) == summary.text_evidence[split]
    articles_qrels = collections.defaultdict(set)
    for row in _dicts(os.path.join(root, split, "text_evidence_qrels_article_level.csv")):
      articles_qrels[int(row["TOPIC"])].add(row["DOCUMENT#"])
    for cid, rows in claims[split].items():
      fields = {k: {r[k] for r in rows} for k in ("Claim", "Origin", "cleaned_truthfulness")}
      assert all(len(v) == 1 for v in fields.values())  # claim fields repeated on each row
      ids = [r["evidence_id"] for r in rows if r["Evidence"]]
      assert ids == qrels.get(cid, [])
      if not ids:
        assert len(rows) == 1 and rows[0]["Evidence"] == ""
      for r in rows:
        if r["Evidence"]:
          snippet = re.sub(r"</?p>", "", r["Evidence"])
          assert snippet == sentences[r["evidence_id"]]["paragraph"]
      assert articles_qrels.get(cid, set()) == {i.split("-")[1] for i in ids}


def test_image_qrels_and_proof_twins(world):
  root, summary = world
  kb_dir = os.path.join(root, "images")
  kb_files = set(os.listdir(kb_dir))
  all_proofs = set()
  for split in SPLITS:
    listed = set()
    for row in _dicts(os.path.join(root, split, "img_evidence_qrels.csv")):
      assert (row["ITERATION"], row["RELEVANCY"]) == ("0", "1")
      kb, proof = row["DOCUMENT#"], row["evidence_id"]
      kb_name, proof_name = image_names.parse_image_name(kb), image_names.parse_image_name(proof)
      assert not kb_name.is_proof and proof_name.is_proof
      assert kb_name.claim_id == proof_name.claim_id == int(row["TOPIC"])
      assert kb_name.description == proof_name.description
      assert kb in kb_files and proof in kb_files
      with open(os.path.join(kb_dir, kb), "rb") as f:
        kb_bytes = f.read()
      for path in (os.path.join(kb_dir, proof), os.path.join(root, split, "images", proof)):
        with open(path, "rb") as f:
          assert f.read() == kb_bytes, path
      listed.add(proof)
    assert set(os.listdir(os.path.join(root, split, "images"))) == listed
    assert len(listed) == summary.image_evidence[split]
    all_proofs |= listed
  assert {n for n in kb_files if "-proof-" in n} == all_proofs
  assert len(kb_files) - len(all_proofs) == summary.kb_images


def test_kb_images_belong_to_their_claims_documents(world):
  root, _ = world
  docs = {(int(r["claim_id"]), int(r["relevant_document_id"]))
          for r in _dicts(os.path.join(root, "Corpus3.csv"))}
  for name in os.listdir(os.path.join(root, "images")):
    parsed = image_names.parse_image_name(name)
    if not parsed.is_proof:
      assert (parsed.claim_id, parsed.relevant_document_id) in docs, name


def test_cleaning_removes_exactly_the_junk(world, plan):
  root, summary = world
  _, plans = plan
  kb = sorted(n for n in os.listdir(os.path.join(root, "images")) if "-proof-" not in n)
  removed = SkipReport()
  kept = image_names.clean_images(os.path.join(root, "images"), kb, removed)
  junk = {img.kb_name for p in plans for img in p.images if img.junk}
  assert {os.path.basename(r.file) for r in removed.records} == junk
  assert len(junk) == summary.junk_images > 0
  reasons = removed.by_reason()
  assert any(r.startswith("smaller than") for r in reasons)  # both rules are exercised
  assert any(r.startswith("name contains") for r in reasons)
  for name in kept[:50]:
    with Image.open(os.path.join(root, "images", name)) as img:
      assert img.format == "JPEG" and img.size == (400, 400)


def test_labels_ratings_and_proportions(world, claims):
  root, summary = world
  scale = get_scale("tiny")
  styles = set()
  for split in SPLITS:
    assert len(claims[split]) == scale.claims_in(split) == summary.claims[split]
    counts = collections.Counter()
    for rows in claims[split].values():
      row = rows[0]
      label = labels.label_from_name(row["cleaned_truthfulness"])
      assert labels.label_from_rating(row["Truthfulness"]) == label, row["Truthfulness"]
      counts[label] += 1
      raw = row["Truthfulness"]
      styles.add("status" if raw.startswith("Status:") else "upper" if raw.isupper() and
                 len(raw) > 1 else "rating" if raw.startswith("Rating:") else "plain")
    n = len(claims[split])
    for label, fraction in enumerate(scales.label_fractions(split)):
      assert abs(counts[label] - n * fraction) <= 1.0, (split, counts)
    assert summary.labels[split] == {labels.LABEL_NAMES[k]: v for k, v in counts.items()}
  assert styles == {"status", "upper", "rating", "plain"}
  train = summary.labels["train"]
  assert train["refuted"] > train["supported"] > train["NEI"]  # ~39/33/28%
  # Release-like fractions (loose: 100 claims).
  assert 0.2 <= summary.evidence_articles / summary.articles <= 0.42
  per_claim = sum(summary.text_evidence.values()) / summary.total_claims
  assert 1.6 <= per_claim <= 3.0
  images_per_claim = sum(summary.image_evidence.values()) / summary.total_claims
  assert 0.5 <= images_per_claim <= 1.1
  assert 6.0 <= (summary.kb_images / summary.total_claims) <= 10.0
  assert 4.5 <= summary.articles / summary.total_claims <= 7.5


def test_rulings_and_explanations(claims):
  lengths, empty = [], 0
  for split in SPLITS:
    for rows in claims[split].values():
      row = rows[0]
      origin, outline = row["Origin"], row["ruling_outline"]
      heading = re.search(r"<p>Our ruling</p>\n<p>([^<]+)</p>", origin)
      in_sum = re.search(r"<p>In sum, ([^<]+)</p>", origin)
      assert heading or in_sum, origin
      found = heading.group(1) if heading else in_sum.group(1)
      if outline:
        assert found == outline or (found[0].upper() + found[1:]) == outline
        lengths.append(len(outline.split()))
        assert row["Claim"] and "<" not in row["Claim"]
      else:
        empty += 1
        assert len(found.split()) >= 30  # the reader extracts it from Origin
  assert 1 <= empty <= 15
  inside = sum(40 <= n <= 150 for n in lengths)
  assert inside >= 0.9 * len(lengths), sorted(lengths)


# ---- difficulty -------------------------------------------------------------------------
_TOKEN = re.compile(r"\w+")


class _BM25:
  """Plain Okapi BM25 (k1=1.2, b=0.75) over lower-cased word tokens."""

  def __init__(self, ids: list[str], texts: list[str]):
    self.ids = ids
    self.docs = [_TOKEN.findall(t.lower()) for t in texts]
    n = len(self.docs)
    self.avg = sum(map(len, self.docs)) / n
    df = collections.Counter(w for d in self.docs for w in set(d))
    self.idf = {w: math.log(1 + (n - c + 0.5) / (c + 0.5)) for w, c in df.items()}
    self.postings = collections.defaultdict(list)
    for i, d in enumerate(self.docs):
      for w, c in collections.Counter(d).items():
        self.postings[w].append((i, c))

  def top(self, query: str, k: int) -> list[str]:
    scores = collections.Counter()
    for w in set(_TOKEN.findall(query.lower())):
      for i, c in self.postings.get(w, ()):
        norm = c + 1.2 * (0.25 + 0.75 * len(self.docs[i]) / self.avg)
        scores[i] += self.idf[w] * c * 2.2 / norm
    return [self.ids[i] for i, _ in scores.most_common(k)]


def test_word_overlap_does_not_solve_retrieval(world, sentences, claims, plan):
  root, _ = world
  know, _ = plan
  entity_of = {c.claim_id: c.entity.name for c in know.claims}
  bm25 = _BM25(list(sentences), [r["paragraph"] for r in sentences.values()])
  recall5, recall100 = [], []
  for split in SPLITS:
    qrels = collections.defaultdict(set)
    for row in _dicts(os.path.join(root, split, "text_evidence_qrels_sentence_level.csv")):
      qrels[int(row["TOPIC"])].add(row["DOCUMENT#"])
    for cid, relevant in qrels.items():
      for corpus_id in relevant:  # findable in principle: evidence names the entity
        assert entity_of[cid].lower() in sentences[corpus_id]["paragraph"].lower()
      query = claims[split][cid][0]["Claim"]
      recall5.append(len(relevant & set(bm25.top(query, 5))) / len(relevant))
      recall100.append(len(relevant & set(bm25.top(query, 100))) / len(relevant))
  r5, r100 = sum(recall5) / len(recall5), sum(recall100) / len(recall100)
  assert r5 < 0.45, r5
  assert r100 > 0.6, r100  # the evidence is among the entity's sentences


def test_image_only_facts(world, claims, plan):
  root, summary = world
  know, _ = plan
  words = set(lexicon.COLOUR_NAMES) | set(lexicon.COUNT_WORDS.values()) | set(lexicon.SHAPES)
  proofs = collections.defaultdict(list)
  for split in SPLITS:
    for row in _dicts(os.path.join(root, split, "img_evidence_qrels.csv")):
      proofs[int(row["TOPIC"])].append(row["evidence_id"])
  checked = colour_checked = 0
  for claim in know.claims:
    if not claim.attribute.visual or claim.label == labels.NEI:
      continue
    checked += 1
    assert proofs[claim.claim_id], claim.claim_id
    rows = claims[claim.split][claim.claim_id]
    for row in rows:
      evidence_words = set(_TOKEN.findall(row["Evidence"].lower()))
      assert not evidence_words & words, row["Evidence"]
      for value in (claim.value.text, claim.true_value.text):
        assert value.lower() not in row["Evidence"].lower()
    if claim.attribute.values.kind == "colour":  # the proof shows the true colour
      target = lexicon.COLOURS[claim.true_value.text]
      with Image.open(os.path.join(root, "images", proofs[claim.claim_id][0])) as img:
        pixels = np.asarray(img.convert("RGB"), dtype=np.int32).reshape(-1, 3)
      near = (((pixels - np.array(target)) ** 2).sum(axis=1) < 40 ** 2).mean()
      assert near > 0.05, (claim.claim_id, claim.true_value.text, near)
      colour_checked += 1
  assert checked == summary.image_only_claims >= 5
  assert colour_checked >= 1


def test_evidence_matches_labels(claims, plan):
  """Supported/refuted text facts: the evidence states the true value, which a refuted
  claim contradicts; NEI: no evidence states the claimed fact's value."""
  know, _ = plan
  for claim in know.claims:
    evidence = " ".join(r["Evidence"] for r in claims[claim.split][claim.claim_id])
    if claim.label == labels.NEI:
      continue
    if not claim.attribute.visual:
      assert claim.true_value.text in evidence
      if claim.label == labels.REFUTED:
        assert claim.value.text != claim.true_value.text
      else:
        assert claim.value == claim.true_value
  # An NEI claim's fact is never stated anywhere in the knowledge base.
  assert all(c.attribute.key not in c.entity.documented
             for c in know.claims if c.label == labels.NEI)


# ---- determinism and the script ---------------------------------------------------------
def test_deterministic_and_seed_dependent(world, tmp_path):
  root, _ = world
  first = _all_files(root)
  write_world(tmp_path / "again", "tiny", seed=0, workers=2, progress=False)
  again = _all_files(str(tmp_path / "again"))
  assert sorted(again) == sorted(first)
  different = [k for k in first if again[k] != first[k]]
  assert not different, different[:5]
  write_world(tmp_path / "other", "tiny", seed=1, workers=0, progress=False)
  other = _all_files(str(tmp_path / "other"))
  for name in ("Corpus3.csv", os.path.join("train", "Corpus2.csv")):
    assert other[name] != first[name]


def test_refuses_non_empty_folder(tmp_path):
  (tmp_path / "keep.txt").write_text("x")
  with pytest.raises(FileExistsError):
    write_world(tmp_path, "tiny", progress=False)
  assert os.listdir(tmp_path) == ["keep.txt"]
  with pytest.raises(ValueError, match="unknown scale"):
    get_scale("huge")


def test_make_world_script(tmp_path):
  env = dict(os.environ, PYTHONPATH=REPO)
  script = os.path.join(REPO, "scripts", "make_world.py")
  out = tmp_path / "w"
  done = subprocess.run([sys.executable, script, f"--out={out}", "--scale=tiny", "--seed=3",
                         "--noprogress"], capture_output=True, text=True, env=env, cwd=REPO)
  assert done.returncode == 0, done.stderr
  assert "train: 75 claims" in done.stdout and "junk" in done.stdout
  assert os.path.isfile(out / "Corpus3.csv")
  refused = subprocess.run([sys.executable, script, f"--out={out}"], capture_output=True,
                           text=True, env=env, cwd=REPO)
  assert refused.returncode == 1
  assert refused.stderr.strip().count("\n") == 0 and "--overwrite" in refused.stderr
  replaced = subprocess.run([sys.executable, script, f"--out={out}", "--overwrite",
                             "--noprogress", "--seed=3"], capture_output=True, text=True,
                            env=env, cwd=REPO)
  assert replaced.returncode == 0, replaced.stderr
