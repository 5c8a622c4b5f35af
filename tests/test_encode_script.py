"""scripts/encode.py on tiny random BERT and CLIP folders, against transformers and in-process."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.tokenizers import train_wordpiece
from mocheg_jax.models import encoding
from mocheg_jax.models import sentence_transformers as st

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATOL = 1e-4
_WORDS = ("the senator said budget river bridge photo claim false true video election "
          "vaccine council report viral tweet image").split()
# Line 2 is empty (an empty text), line 5 is far over every max length used here.
TEXTS = ["The senator said the bridge photo is false.", "", "viral tweet",
         "A claim about the council report and the election video!",
         " ".join(_WORDS * 6), "budget"]
CLIP_POSITIONS = 16


def _corpus():
  rng = np.random.default_rng(0)
  return [" ".join(rng.choice(_WORDS, 8)) for _ in range(200)] + TEXTS


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  root = tmp_path_factory.mktemp("encode")
  bert_dir, clip_dir = root / "bert", root / "clip"
  tokenizer = train_wordpiece(_corpus(), bert_dir, vocab_size=120)
  train_wordpiece(_corpus(), clip_dir, vocab_size=120)
  vocab = len(tokenizer)
  torch.manual_seed(0)
  bert = transformers.BertModel(transformers.BertConfig(
      vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=37, max_position_embeddings=64)).eval()
  bert.save_pretrained(bert_dir, safe_serialization=True)
  # The text tower pools at the first EOS: the tokenizer's [SEP]; [CLS] opens, [PAD] pads.
  specials = dict(eos_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id,
                  pad_token_id=tokenizer.pad_token_id)
  clip = transformers.CLIPModel(transformers.CLIPConfig(
      text_config=dict(vocab_size=vocab, hidden_size=32, intermediate_size=37,
                       num_attention_heads=4, num_hidden_layers=2,
                       max_position_embeddings=CLIP_POSITIONS, **specials),
      vision_config=dict(hidden_size=48, intermediate_size=61, num_attention_heads=4,
                         num_hidden_layers=2, image_size=32, patch_size=8),
      projection_dim=24)).eval()
  clip.save_pretrained(clip_dir, safe_serialization=True)
  return dict(bert=(bert_dir, bert, tokenizer), clip=(clip_dir, clip, tokenizer), root=root)


def _encode(*args):
  env = dict(os.environ, PYTHONPATH=REPO)
  return subprocess.run([sys.executable, "scripts/encode.py", *map(str, args)], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=300)


def _write_lines(path, lines):
  path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
  return path


def _tokens(tokenizer, texts, max_length, side="right"):
  tokenizer.truncation_side = side
  try:
    batch = tokenizer(texts, truncation=True, max_length=max_length, padding=True,
                      return_tensors="pt")
  finally:
    tokenizer.truncation_side = "right"
  return batch["input_ids"], batch["attention_mask"]


def test_bert_folder_texts_match_transformers_and_in_process(folders, tmp_path):
  folder, reference, tokenizer = folders["bert"]
  out = tmp_path / "sub" / "bert.npy"  # The folder is created.
  run = _encode(f"--model={folder}", f"--input={_write_lines(tmp_path / 'in.txt', TEXTS)}",
                f"--output={out}", "--batch_size=4", "--max_length=16",
                "--truncation_side=left")
  assert run.returncode == 0, run.stderr
  assert "wrote 6 x 32" in run.stdout
  got = np.load(out)
  assert got.shape == (len(TEXTS), 32) and got.dtype == np.float32
  ids, mask = _tokens(tokenizer, TEXTS, 16, side="left")
  with torch.no_grad():
    hidden = reference(input_ids=ids, attention_mask=mask).last_hidden_state
  weights = mask[..., None].float()
  expected = ((hidden * weights).sum(1) / weights.sum(1)).numpy()  # Mean over real tokens.
  np.testing.assert_allclose(got, expected, atol=ATOL, rtol=0)
  model = st.load(folder)
  here = st.encode_texts(model.encoder, model.tokenizer, TEXTS, batch_size=8, max_length=16,
                         truncation_side="left")
  np.testing.assert_allclose(got, here, atol=1e-5, rtol=0)


def test_clip_folder_texts_and_images_match_transformers(folders, tmp_path):
  from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
  folder, reference, tokenizer = folders["clip"]
  texts_out, images_out = tmp_path / "texts.npy", tmp_path / "images.npy"
  run = _encode(f"--model={folder}", f"--input={_write_lines(tmp_path / 't.txt', TEXTS)}",
                f"--output={texts_out}")
  assert run.returncode == 0, run.stderr
  ids, mask = _tokens(tokenizer, TEXTS, CLIP_POSITIONS)  # Default: all 16 positions.
  assert ids.shape[1] == CLIP_POSITIONS
  with torch.no_grad():
    expected = reference.get_text_features(input_ids=ids, attention_mask=mask).pooler_output
  got = np.load(texts_out)
  assert got.shape == (len(TEXTS), 24)
  np.testing.assert_allclose(got, expected.numpy(), atol=ATOL, rtol=0)

  rng = np.random.default_rng(1)
  paths = []
  for i, (width, height) in enumerate([(40, 32), (32, 57), (64, 64), (33, 90), (50, 41)]):
    path = tmp_path / f"img{i}.png"
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    paths.append(str(path))
  run = _encode(f"--model={folder}", "--images", "--batch_size=2",
                f"--input={_write_lines(tmp_path / 'i.txt', paths)}", f"--output={images_out}")
  assert run.returncode == 0, run.stderr
  processor = CLIPImageProcessorPil(size={"shortest_edge": 32},
                                    crop_size={"height": 32, "width": 32})
  pixels = processor([Image.open(p) for p in paths], return_tensors="pt")["pixel_values"]
  with torch.no_grad():
    expected = reference.get_image_features(pixel_values=pixels).pooler_output
  got = np.load(images_out)
  assert got.shape == (5, 24)
  np.testing.assert_allclose(got, expected.numpy(), atol=ATOL, rtol=0)


def test_bad_input_is_one_line_and_exit_1(folders, tmp_path):
  bert_dir, clip_dir = folders["bert"][0], folders["clip"][0]
  good = Image.new("RGB", (40, 40))
  good.save(tmp_path / "good.png")
  (tmp_path / "broken.png").write_bytes(b"not an image at all")
  images = _write_lines(tmp_path / "images.txt", [str(tmp_path / "good.png"),
                                                  str(tmp_path / "broken.png")])
  cases = [
      ([f"--model={bert_dir}", f"--input={tmp_path / 'missing.txt'}"],
       "missing.txt: input file does not exist"),
      ([f"--model={clip_dir}", f"--input={images}", "--images"],
       f"images.txt:2: cannot read image '{tmp_path / 'broken.png'}'"),
      ([f"--model={bert_dir}", f"--input={images}", "--images"],
       "holds a bert model, which encodes texts only"),
  ]
  for args, message in cases:
    run = _encode(*args, f"--output={tmp_path / 'out.npy'}")
    assert run.returncode == 1, (args, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], (
        args, run.stderr)
  assert not (tmp_path / "out.npy").exists()


def test_read_lines_keeps_empty_lines(tmp_path):
  path = tmp_path / "in.txt"
  for data, expected in [(b"a\n\nb\r\n", ["a", "", "b"]), (b"a\n\nb", ["a", "", "b"]),
                         (b"", []), (b"\n", [""]), (b"\xef\xbb\xbfx\n\n", ["x", ""])]:
    path.write_bytes(data)
    assert encoding.read_lines(path) == expected, data
  path.write_bytes(b"ok\nbad \xff byte\n")
  with pytest.raises(MochegInputError, match=r"in.txt:2: not valid UTF-8"):
    encoding.read_lines(path)


def test_image_errors_name_the_line_before_any_work(folders, tmp_path):
  from mocheg_jax.models.hf import clip as hf_clip
  model = hf_clip.load(folders["clip"][0])
  with pytest.raises(MochegInputError, match=r"list.txt:1: cannot read image .*does not exist"):
    encoding.encode_clip_images(model, [str(tmp_path / "nope.jpg")] * 2,
                                source="list.txt")
  with pytest.raises(MochegInputError, match=r"image 0: empty image path"):
    encoding.encode_clip_images(model, [""])
  assert encoding.encode_clip_images(model, []).shape == (0, 24)


def test_batching_core_buckets_and_order():
  assert encoding.batch_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
  assert encoding.batch_buckets(6) == [1, 2, 4, 6]
  assert encoding.length_buckets(77) == [8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 77]
  shapes = []

  def forward(ids, mask):  # Row sums identify each text; padding must be masked.
    shapes.append(ids.shape)
    return np.stack([(ids * mask).sum(1), mask.sum(1)], axis=1).astype(np.float32)

  class Tokenizer:  # "n" words -> ids 1..n, plus BOS 100 and EOS 101.
    truncation_side, pad_token_id = "right", 7

    def __call__(self, texts, truncation, max_length, **kwargs):
      ids = []
      for t in texts:
        body = list(range(1, len(t.split()) + 1))
        body = body[:max_length - 2] if self.truncation_side == "right" else (
            body[-(max_length - 2):])
        ids.append([100, *body, 101])
      return {"input_ids": ids}

  texts = ["w " * n for n in (3, 0, 30, 1, 5, 2, 9)]
  out = encoding.run_text_encoder(forward, Tokenizer(), texts, width=2, max_length=10,
                                  batch_size=3, chunk_batches=1)
  lengths = [min(n, 8) + 2 for n in (3, 0, 30, 1, 5, 2, 9)]
  np.testing.assert_array_equal(out[:, 1], lengths)  # Input order kept across chunks.
  np.testing.assert_array_equal(out[:, 0], [201 + (k - 2) * (k - 1) / 2 for k in lengths])
  assert all(s[0] in (1, 2, 3) and s[1] in (8, 10) for s in shapes), shapes
