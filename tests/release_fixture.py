"""A hand-written miniature release with the awkward cases the reader must handle."""

from __future__ import annotations

import csv
import os

from PIL import Image

CORPUS2_HEADER = ["claim_id", "Snopes URL", "Claim", "Truthfulness", "Evidence", "evidence_id",
                  "Origin", "cleaned_truthfulness", "ruling_outline"]

ORIGIN_WITH_RULING = ("<p>Some background on the rumour.</p><p>Our ruling</p>"
                      "<p>The photograph shows a different bridge, so the claim is false.</p>")


def _write_csv(path, header, rows):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)


def _image(path, size, color=(200, 30, 30)):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  Image.new("RGB", size, color).save(path, format="JPEG")


def write_release(root: str, with_sentence_file: bool = True) -> None:
  train = [
      # claim 1: two evidence rows, one empty (must not become "nan"), a <p> tag.
      [1, "u1", "The bridge has 3 arches.", "TRUE", "<p>It has three arches.</p>", "e1", "",
       "supported", "The bridge indeed has three arches."],
      [1, "u1", "The bridge has 3 arches.", "TRUE", "", "e2", "", "supported", "ignored"],
      [1, "u1", "The bridge has 3 arches.", "TRUE", "Built in 1901.", "e3", "", "supported", ""],
      # claim 2: empty ruling_outline -> extracted from Origin's "Our ruling" paragraph.
      [2, "u2", "A photo shows the Varlen bridge.", "Miscaptioned", "A photo of a bridge.", "e4",
       ORIGIN_WITH_RULING, "refuted", ""],
      # claim 3: unknown label -> skipped and reported.
      [3, "u3", "Unknowable.", "Who knows", "x", "e5", "", "maybe", "x"],
      # claim 4: cleaned label missing, raw rating mapped through the table.
      [4, "u4", "The mayor is Dr. Venn.", "Status: Unproven.", "", "e6", "", "", "Unclear."],
  ]
  _write_csv(os.path.join(root, "train", "Corpus2.csv"), CORPUS2_HEADER, train)
  # A malformed row (too few fields) appended by hand.
  with open(os.path.join(root, "train", "Corpus2.csv"), "a", encoding="utf-8") as f:
    f.write("5,u5,broken row\n")
  for split in ("val", "test"):
    _write_csv(os.path.join(root, split, "Corpus2.csv"), CORPUS2_HEADER,
               [[10, "u", "Claim ten.", "False", "Ev.", "e", "", "refuted", "Ruling ten."]])
  docs = [
      [1, 7, "s", "l", "a", "<p>Dr. Venn opened it. It has three arches.</p><p>Built in 1901.</p>"],
      [2, 8, "s", "l", "a", "<p>A photo of a bridge. It is not Varlen.</p>"],
      [10, 9, "s", "l", "a", "Ev. More text here."],
      ["x", 9, "s", "l", "a", "bad id row"],
  ]
  _write_csv(os.path.join(root, "Corpus3.csv"),
             ["claim_id", "relevant_document_id", "Snopes URL", "Link URL", "Archive Url",
              "Origin Document"], docs)
  if with_sentence_file:
    sentences = [
        [1, 7, 0, "1-7-0", "Dr. Venn opened it."], [1, 7, 1, "1-7-1", "It has three arches."],
        [1, 7, 2, "1-7-2", "Built in 1901."], [2, 8, 0, "2-8-0", "A photo of a bridge."],
        [2, 8, 1, "2-8-1", "It is not Varlen."], [10, 9, 0, "10-9-0", "Ev."],
        [10, 9, 1, "10-9-1", "More text here."],
    ]
    _write_csv(os.path.join(root, "supplementary", "Corpus3_sentence_level.csv"),
               ["claim_id", "relevant_document_id", "paragraph_id", "corpus_id", "paragraph"],
               sentences)
  qrel_header = ["TOPIC", "ITERATION", "DOCUMENT#", "RELEVANCY"]
  _write_csv(os.path.join(root, "train", "text_evidence_qrels_sentence_level.csv"), qrel_header,
             [[1, 0, "1-7-1", 1], [1, 0, "1-7-2", 1], [2, 0, "2-8-0", 1], [2, 0, "2-8-1", 0]])
  for split in ("val", "test"):
    _write_csv(os.path.join(root, split, "text_evidence_qrels_sentence_level.csv"),
               qrel_header, [[10, 0, "10-9-0", 1]])
    _write_csv(os.path.join(root, split, "img_evidence_qrels.csv"),
               qrel_header + ["evidence_id"], [])
  _write_csv(os.path.join(root, "train", "img_evidence_qrels.csv"), qrel_header + ["evidence_id"],
             [[2, 0, "00002-00008-01-bridge.jpg", 1, "00002-proof-01-bridge.jpg"]])
  images = os.path.join(root, "images")
  _image(os.path.join(images, "00002-00008-01-bridge.jpg"), (400, 400))
  _image(os.path.join(images, "00002-proof-01-bridge.jpg"), (400, 400))
  _image(os.path.join(images, "00001-00007-01-site-logo.jpg"), (400, 400))
  _image(os.path.join(images, "00001-00007-02-.jpg"), (120, 90))
  _image(os.path.join(images, "00001-00007-03-photo.jpg"), (640, 480), (10, 120, 10))
  with open(os.path.join(images, "00001-00007-04-broken.jpg"), "wb") as f:
    f.write(b"not a jpeg")
  _image(os.path.join(root, "train", "images", "00002-proof-01-bridge.jpg"), (400, 400))
