r"""Encodes the KB with a trained retriever into an on-disk index (resumable).

  python scripts/index.py --checkpoint=WORKDIR --out=INDEX_DIR [--release=DIR] \
      [--which=best|latest] [--batch_size=4096] [--dtype=float32|float16]

WORKDIR is a text or image retriever's training workdir; its best checkpoint (by the
config's best_metric) is used unless --which=latest. The modality follows the retriever:
every KB sentence, or every KB image kept by the cleaning rules. The release defaults to the
one the retriever was trained on. Rerunning after an interruption resumes from the last
finished shard; an index folder written by another encoder is an error.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json

from absl import app
from absl import flags

from mocheg_jax.retrieval import system
from mocheg_jax.train.restore import WHICH, load_trained
from mocheg_jax.utils.cli import friendly_errors

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "A retriever's training workdir.",
                                  required=True)
_OUT = flags.DEFINE_string("out", None, "The index folder.", required=True)
_RELEASE = flags.DEFINE_string("release", None, "The release whose KB is indexed (default: "
                               "the one the retriever was trained on).")
_WHICH = flags.DEFINE_enum("which", "best", WHICH, "Which checkpoint of the workdir.")
_BATCH = flags.DEFINE_integer("batch_size", 4096, "Items encoded per call.")
_SHARD = flags.DEFINE_integer("shard_size", 65536, "Rows per shard file.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "float16"], "Storage type.")


@friendly_errors
def main(argv: list[str]) -> None:
  del argv
  trained = load_trained(_CHECKPOINT.value, _WHICH.value)
  manifest = system.build_index(trained, system.release_of(trained, _RELEASE.value), _OUT.value,
                                batch_size=_BATCH.value, shard_size=_SHARD.value,
                                dtype=_DTYPE.value)
  print(json.dumps({"index": _OUT.value, "kind": manifest.kind, "items": manifest.num_items,
                    "dim": manifest.dim, "step": trained.step}))


if __name__ == "__main__":
  app.run(main)
