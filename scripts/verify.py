r"""Predicts refuted / supported / NEI for every claim of a split with a trained verifier.

  python scripts/verify.py --checkpoint=WORKDIR --split=test --evidence=gold|RESULT_CSV \
      --out=FILE.csv [--release=DIR] [--which=best|latest] [--ablations=FILE.json]

WORKDIR is a verifier's training workdir (configs/verify.py). --evidence=gold uses each
claim's own evidence and proof images; a retrieval result CSV (scripts/search.py) uses the
retrieved ones. The modalities follow the trained model (text, image, both or none). Writes
`claim_id,label,p_refuted,p_supported,p_nei` for every claim and prints micro/macro F1
against the split's gold labels. --ablations also scores the same claims with parts of their
evidence taken away (without images, without text; for a result CSV, only the retrieved
items the qrels judge relevant: mocheg_jax/verification/ablations.py), prints the table and
writes it as JSON: which part of the evidence helps the model and which misleads it.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json

from absl import app
from absl import flags

from mocheg_jax.data.mocheg import SPLITS
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.train.restore import WHICH, load_trained
from mocheg_jax.utils.cli import friendly_errors
from mocheg_jax.verification import ablations as ablations_lib
from mocheg_jax.verification import task as verify_task
from mocheg_jax.verification.predictions import write_predictions

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "The verifier's training workdir.",
                                  required=True)
_WHICH = flags.DEFINE_enum("which", "best", WHICH, "Which checkpoint of the workdir.")
_RELEASE = flags.DEFINE_string("release", None, "The release (default: the training one).")
_SPLIT = flags.DEFINE_enum("split", "test", list(SPLITS), "Whose claims are verified.")
_EVIDENCE = flags.DEFINE_string("evidence", "gold", "gold, or a retrieval result CSV.")
_OUT = flags.DEFINE_string("out", None, "The prediction CSV to write.", required=True)
_ABLATIONS = flags.DEFINE_string(
    "ablations", None, "Also score the claims with parts of their evidence taken away and "
    "write the table here (JSON).")


@friendly_errors
def main(argv: list[str]) -> None:
  del argv
  trained = load_trained(_CHECKPOINT.value, _WHICH.value)
  verifier = trained.task.inference
  if not isinstance(verifier, verify_task.Verifier):
    raise MochegInputError(f"{_CHECKPOINT.value}: its task ({trained.config.task}) is not a "
                           "verifier")
  if _RELEASE.value:
    verifier.release = _RELEASE.value
  claims = verifier.evidence(_SPLIT.value, _EVIDENCE.value)
  probabilities = verifier.predict(trained.model, claims)
  write_predictions(_OUT.value, [c.claim_id for c in claims], probabilities)
  scores = verify_task.scores([c.label for c in claims], probabilities)
  if _ABLATIONS.value:
    v = trained.config.verify
    names = ablations_lib.applicable(v.use_text, v.use_image,
                                     system=_EVIDENCE.value != verify_task.GOLD)
    rows = ablations_lib.score_ablations(lambda c: verifier.predict(trained.model, c), claims,
                                         names, given=probabilities)
    with open(_ABLATIONS.value, "w") as f:
      json.dump({"split": _SPLIT.value, "evidence": _EVIDENCE.value, "step": trained.step,
                 "rows": rows}, f, indent=1)
    print(ablations_lib.markdown(rows))
  print(json.dumps({"claims": len(claims), "split": _SPLIT.value, "out": _OUT.value,
                    "step": trained.step, **{k: round(v, 4) for k, v in scores.items()}}))


if __name__ == "__main__":
  app.run(main)
