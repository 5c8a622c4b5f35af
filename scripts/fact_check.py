"""Fact-checks claims with a trained pipeline folder (what scripts/run_pipeline.py writes).

  python scripts/fact_check.py --pipeline=runs/small --claim="The Flag of Varn is red." \
      [--image=photo.png]
  python scripts/fact_check.py --pipeline=runs/small --input=claims.jsonl --output=out.jsonl

One claim: prints one JSON object on stdout (claim, text_evidence [{id, text, score}],
image_evidence [{file, score}], label, probabilities {refuted, supported, NEI},
explanation). Many: each input line is {"claim": "...", "image": "optional/path.png"};
each output line is the result of the input line of the same number. Nothing is printed or
written until every claim is checked, so a failure never leaves a partial JSON: bad input
(an empty or over-long claim, an unreadable image, a pipeline folder missing a stage) is one
`error: ...` line on stderr naming it, and exit status 1. Logs go to stderr.
"""

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import contextlib
import json
import os
import sys

from absl import app, flags

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.utils import files
from mocheg_jax.utils.cli import friendly_errors

_PIPELINE = flags.DEFINE_string("pipeline", None, "The pipeline folder (the main job's "
                                "--workdir).", required=True)
_CLAIM = flags.DEFINE_string("claim", None, "One claim to check.")
_IMAGE = flags.DEFINE_string("image", None, "An image that comes with --claim.")
_INPUT = flags.DEFINE_string("input", None, "JSON lines: {\"claim\": ..., \"image\": ...}.")
_OUTPUT = flags.DEFINE_string("output", None, "JSON lines out, one per input line.")
_COMPILATION_CACHE = flags.DEFINE_boolean(
    "compilation_cache", True, "Read back the programs the main job (or an earlier check) "
    "compiled from PIPELINE/compilation_cache, and keep new ones there, when the folder is "
    "writable (mocheg_jax/utils/compile_cache.py).")


def read_requests(path: str) -> tuple[list[str], list[str | None]]:
  """(claims, images) of a JSON-lines file; a bad line is an error naming it."""
  claims, images = [], []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        raise MochegInputError(f"{path}:{number}: empty line (one JSON object per line)")
      try:
        request = json.loads(line)
      except json.JSONDecodeError as e:
        raise MochegInputError(f"{path}:{number}: not JSON ({e.msg})") from None
      if not isinstance(request, dict) or not isinstance(request.get("claim"), str):
        raise MochegInputError(f"{path}:{number}: expected an object with a \"claim\" string")
      image = request.get("image")
      if image is not None and not isinstance(image, str):
        raise MochegInputError(f"{path}:{number}: \"image\" must be a path string")
      unknown = sorted(set(request) - {"claim", "image"})
      if unknown:
        raise MochegInputError(f"{path}:{number}: unknown field(s) {unknown}")
      claims.append(request["claim"])
      images.append(image)
  if not claims:
    raise MochegInputError(f"{path}: no claims")
  return claims, images


def _where(error: MochegInputError, source: str | None) -> MochegInputError:
  """Claim-numbered errors of the checker, renamed to the input file's lines."""
  message = str(error)
  if message.startswith("claim "):
    index, _, rest = message[len("claim "):].partition(":")
    if index.isdigit():
      return MochegInputError(f"{source}:{int(index) + 1}:{rest}" if source
                              else f"the claim:{rest}")
  return error


@friendly_errors
def main(argv):
  del argv
  if (_CLAIM.value is None) == (_INPUT.value is None):
    raise app.UsageError("give exactly one of --claim and --input")
  if _INPUT.value is not None and (_IMAGE.value is not None or _OUTPUT.value is None):
    raise app.UsageError("--input goes with --output (images come in the input lines)")
  if _INPUT.value is None and _OUTPUT.value is not None:
    raise app.UsageError("--output goes with --input")
  if _INPUT.value is not None:
    claims, images = read_requests(_INPUT.value)
  else:
    claims, images = [_CLAIM.value], [_IMAGE.value]

  # After flag checks: loading JAX is slow.
  from mocheg_jax.utils import compile_cache
  if _COMPILATION_CACHE.value and os.access(_PIPELINE.value, os.W_OK | os.X_OK):
    compile_cache.use_workdir_cache(_PIPELINE.value)  # Before anything compiles.
  compiles = compile_cache.CompileTally()
  from mocheg_jax.pipeline import fact_checker
  claims, images = _checked(fact_checker, claims, images)
  # Library code logs with print; stdout carries only the JSON.
  with contextlib.redirect_stdout(sys.stderr):
    checker = fact_checker.FactChecker.load(_PIPELINE.value)
    try:
      results = [r.to_json() for r in checker.check_many(claims, images)]
    finally:
      checker.close()
    print(compiles.summary())
  if _INPUT.value is None:
    print(json.dumps(results[0], ensure_ascii=False))
    return
  with files.atomic_open(_OUTPUT.value) as f:
    for result in results:
      f.write(json.dumps(result, ensure_ascii=False) + "\n")
  print(json.dumps({"claims": len(results), "output": _OUTPUT.value}), file=sys.stderr)


def _checked(fact_checker, claims, images):
  """Refuses bad claims and images before any model is loaded."""
  try:
    return fact_checker.check_claims(claims, images)
  except MochegInputError as e:
    raise _where(e, _INPUT.value) from None


if __name__ == "__main__":
  app.run(main)
