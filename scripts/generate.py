r"""Generates text with a BART checkpoint: one source per input line, one output per line.

  python scripts/generate.py --model=DIR --input=sources.txt --output=generated.txt \
      [--num_beams=4 --no_repeat_ngram_size=3 --max_length=400] [--do_sample --top_p=0.9 \
      --seed=0] [--batch_size=8 --max_source_length=512 --truncation_side=right]

`--model` is an HF BART folder (config.json, model.safetensors or pytorch_model.bin,
optional generation_config.json) that also holds the tokenizer files. Generation flags left
unset take the checkpoint's settings (as transformers' `generate` would).

Input: UTF-8, one source per line ("\n" separated; a trailing "\r" is dropped). A line that
is empty or only whitespace is not sent to the model and gives an empty output line.
Output: exactly one line per input line, in input order; special tokens are removed, and
newlines inside a generation become spaces. Sources longer than --max_source_length tokens
(special tokens included) are truncated on --truncation_side (`left` keeps the end, which
is the reference Mocheg code's behaviour and drops the label/claim prefix).

Sources are sorted by length and batched into power-of-two length buckets, so only a few
programs compile; the whole decoding loop of each batch is one compiled XLA program.
Unusable input: one `error: ...` line on stderr and exit status 1.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import sys
import time

from absl import app, flags

_MODEL = flags.DEFINE_string("model", None, "HF BART folder with tokenizer files.",
                             required=True)
_INPUT = flags.DEFINE_string("input", None, "Text file, one source per line.", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Text file to write, one line per input line.",
                              required=True)
_NUM_BEAMS = flags.DEFINE_integer("num_beams", None, "Beam size (1: greedy / sampling).")
_MAX_LENGTH = flags.DEFINE_integer("max_length", None,
                                   "Longest output in tokens, the decoder start token counted.")
_MIN_LENGTH = flags.DEFINE_integer("min_length", None, "EOS is banned below this length.")
_NO_REPEAT = flags.DEFINE_integer("no_repeat_ngram_size", None, "Ban repeated n-grams.")
_LENGTH_PENALTY = flags.DEFINE_float("length_penalty", None, "Beam score / length**this.")
_EARLY_STOPPING = flags.DEFINE_enum("early_stopping", None, ["true", "false", "never"],
                                    "Beam search stopping rule (as transformers).")
_DO_SAMPLE = flags.DEFINE_boolean("do_sample", False, "Sample instead of greedy decoding.")
_TOP_K = flags.DEFINE_integer("top_k", None, "Sampling: keep the k best tokens (0: all).")
_TOP_P = flags.DEFINE_float("top_p", None, "Sampling: nucleus probability.")
_TEMPERATURE = flags.DEFINE_float("temperature", None, "Sampling temperature.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling PRNG seed.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 8, "Sources per batch.", lower_bound=1)
_MAX_SOURCE = flags.DEFINE_integer("max_source_length", None,
                                   "Truncate sources to this many tokens (default: the "
                                   "model's position table).", lower_bound=4)
_TRUNCATION_SIDE = flags.DEFINE_enum("truncation_side", "right", ["right", "left"],
                                     "Which end of an over-long source is cut.")

MIN_BUCKET = 8


def read_lines(path: str) -> list[str]:
  from mocheg_jax.data.report import MochegInputError
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except UnicodeDecodeError as e:
    raise MochegInputError(f"{path}: not UTF-8 text ({e})") from None
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()  # The final newline ends the last line; it does not start a new one.
  return [line[:-1] if line.endswith("\r") else line for line in lines]


def bucket_length(length: int, cap: int) -> int:
  """The power of two (at least MIN_BUCKET) that holds `length`, capped at `cap`."""
  size = MIN_BUCKET
  while size < length:
    size *= 2
  return min(size, cap)


def _generation_overrides() -> dict:
  early = {"true": True, "false": False, "never": "never", None: None}[_EARLY_STOPPING.value]
  values = dict(num_beams=_NUM_BEAMS.value, max_length=_MAX_LENGTH.value,
                min_length=_MIN_LENGTH.value, no_repeat_ngram_size=_NO_REPEAT.value,
                length_penalty=_LENGTH_PENALTY.value, early_stopping=early,
                top_k=_TOP_K.value, top_p=_TOP_P.value, temperature=_TEMPERATURE.value)
  values = {k: v for k, v in values.items() if v is not None}
  if _DO_SAMPLE.value:
    values["do_sample"] = True
  return values


def run() -> dict:
  """Reads, generates and writes; returns a summary."""
  import jax
  import numpy as np

  from mocheg_jax.data.report import MochegInputError
  from mocheg_jax.data.tokenizers import load_tokenizer
  from mocheg_jax.models import decoding
  from mocheg_jax.models.hf import bart as hf_bart
  from mocheg_jax.utils.progress import Progress

  lines = read_lines(_INPUT.value)
  tokenizer = load_tokenizer(_MODEL.value)
  model = hf_bart.load(_MODEL.value)
  if len(tokenizer) > model.config.vocab_size:
    raise MochegInputError(f"{_MODEL.value}: the tokenizer has {len(tokenizer)} tokens but "
                           f"the model only {model.config.vocab_size}")
  try:
    config = decoding.GenerationConfig.from_model(model.config, **_generation_overrides())
  except ValueError as e:
    raise MochegInputError(f"generation flags: {e}") from None
  positions = model.config.max_position_embeddings
  max_source = min(_MAX_SOURCE.value or positions, positions)
  tokenizer.truncation_side = _TRUNCATION_SIDE.value

  todo = [i for i, line in enumerate(lines) if line.strip()]
  encoded = (tokenizer([lines[i] for i in todo], truncation=True,
                       max_length=max_source)["input_ids"] if todo else [])
  order = sorted(range(len(todo)), key=lambda j: len(encoded[j]))
  outputs = [""] * len(lines)
  batch_size = _BATCH_SIZE.value
  key = jax.random.key(_SEED.value)
  start, generated = time.monotonic(), 0
  with Progress("generate", total=len(todo), unit="lines") as progress:
    for b in range(0, len(order), batch_size):
      chunk = order[b:b + batch_size]
      width = bucket_length(max(len(encoded[j]) for j in chunk), max_source)
      # A full batch always (padding rows repeat a real source), so shapes stay fixed.
      ids = np.full((batch_size, width), model.config.pad_token_id, np.int32)
      mask = np.zeros((batch_size, width), np.int32)
      for row in range(batch_size):
        tokens = encoded[chunk[min(row, len(chunk) - 1)]]
        ids[row, :len(tokens)], mask[row, :len(tokens)] = tokens, 1
      rng = jax.random.fold_in(key, b) if config.do_sample else None
      out = decoding.generate(model, ids, mask, config, rng=rng)
      sequences, lengths = np.asarray(out.sequences), np.asarray(out.lengths)
      for row, j in enumerate(chunk):
        text = tokenizer.decode(sequences[row, :lengths[row]].tolist(),
                                skip_special_tokens=True)
        outputs[todo[j]] = " ".join(text.split("\n")).strip()
        generated += int(lengths[row]) - 1
      progress.update(len(chunk))
  with open(_OUTPUT.value, "w", encoding="utf-8") as f:
    f.write("".join(text + "\n" for text in outputs))
  seconds = time.monotonic() - start
  return dict(lines=len(lines), generated=len(todo), empty=len(lines) - len(todo),
              tokens=generated, seconds=seconds)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  from mocheg_jax.utils.cli import USER_ERRORS
  try:
    summary = run()
  except (*USER_ERRORS, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(f"{summary['lines']} lines ({summary['empty']} empty) -> {_OUTPUT.value}: "
        f"{summary['tokens']} tokens in {summary['seconds']:.1f}s", file=sys.stderr)


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Before JAX starts (mocheg_jax/utils/host_memory.py).
  app.run(main)
