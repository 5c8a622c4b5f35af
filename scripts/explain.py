r"""Generates a ruling explanation for every claim of a split with a trained generator.

  python scripts/explain.py --checkpoint=WORKDIR --release=DIR --split=test \
      --labels=gold|VERIFY_CSV --evidence=gold|RESULT_CSV --out=FILE.csv \
      [--batch_size=N] [--top_text=5] [--which=best|latest]

WORKDIR is a generator's training workdir (configs/explain.py). The generator reads
"{label} </s> {claim} </s> {evidence}": --labels=gold gives each claim its release label, a
verifier's prediction CSV (scripts/verify.py) its predicted one; --evidence=gold gives the
claim's own text evidence, a retrieval result CSV (scripts/search.py) its top --top_text
retrieved sentences. Decoding is the checkpoint's (beam search, no-repeat n-gram size and
maximum length of config.explain), compiled whole.

Writes `claim_id,explanation` for every claim of the split; claims without a row in the
prediction CSV are skipped and counted (see mocheg_jax/explanation/inputs.py for every
rule). Prints one JSON line: the counts, and ROUGE/BLEU against the split's gold
explanations where it has them.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json

from absl import app
from absl import flags

from mocheg_jax.data.mocheg import SPLITS, MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.explanation import generator_task
from mocheg_jax.explanation import inputs as inputs_lib
from mocheg_jax.explanation import stage
from mocheg_jax.explanation import table5
from mocheg_jax.train.data import prepared_data
from mocheg_jax.train.restore import WHICH, load_trained
from mocheg_jax.utils.cli import friendly_errors

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "The generator's training workdir.",
                                  required=True)
_WHICH = flags.DEFINE_enum("which", "best", WHICH, "Which checkpoint of the workdir.")
_RELEASE = flags.DEFINE_string("release", None, "The release (default: the training one).")
_SPLIT = flags.DEFINE_enum("split", "test", list(SPLITS), "Whose claims are explained.")
_LABELS = flags.DEFINE_string("labels", "gold", "gold, or a verifier's prediction CSV.")
_EVIDENCE = flags.DEFINE_string("evidence", "gold", "gold, or a retrieval result CSV.")
_OUT = flags.DEFINE_string("out", None, "The explanation CSV to write.", required=True)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", None, "Sources per decoding batch "
                                   "(default: the checkpoint's explain.eval_batch_size).",
                                   lower_bound=1)
_TOP_TEXT = flags.DEFINE_integer("top_text", inputs_lib.TOP_TEXT,
                                 "Retrieved sentences read per claim with a result CSV.",
                                 lower_bound=0)


@friendly_errors
def main(argv: list[str]) -> None:
  del argv

  def inputs(release: MochegRelease) -> inputs_lib.ExplainInputs:
    return inputs_lib.build_inputs(release, _SPLIT.value, labels=_LABELS.value,
                                   evidence=_EVIDENCE.value, top_text=_TOP_TEXT.value)

  # With --release the inputs are checked before the model is loaded (bad input fails fast).
  release = MochegRelease(_RELEASE.value) if _RELEASE.value else None
  x = inputs(release) if release else None
  trained = load_trained(_CHECKPOINT.value, _WHICH.value)
  if not isinstance(trained.task.inference, generator_task.Explainer):
    raise MochegInputError(f"{_CHECKPOINT.value}: its task ({trained.config.task}) is not "
                           "an explanation generator")
  if release is None:
    release = MochegRelease(prepared_data(trained.config, _CHECKPOINT.value,
                                          log=lambda _: None).release)
    x = inputs(release)
  texts = stage.generate(trained, x.claims, _BATCH_SIZE.value)
  ids = [c.claim_id for c in x.claims]
  stage.write_explanations(_OUT.value, ids, texts)
  report = {"split": _SPLIT.value, "out": _OUT.value, "step": trained.step,
            "written": len(ids), **x.counts(),
            "truncated_sources": inputs_lib.count_truncated(
                trained.task.inference.tokenizer, x.claims,
                trained.config.explain.max_source_len)}
  if x.no_reference < len(x.claims):
    references = {c.claim_id: c.explanation for c in release.claims(_SPLIT.value)}
    scores = table5.score_explanations(dict(zip(ids, texts)), references)
    report.update({k: round(scores[k], 4) for k in ("rouge1", "rouge2", "rougeL", "bleu")})
  print(json.dumps(report))


if __name__ == "__main__":
  app.run(main)
