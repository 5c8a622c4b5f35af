"""Converts a checkpoint folder between HF (safetensors) and orbax, through our model.

  python scripts/convert.py --from=HF_DIR --to=OUT_DIR            # HF -> orbax
  python scripts/convert.py --from=OUT_DIR --to=HF_DIR --format=hf  # and back

The model is loaded with our conversion table (every tensor checked), then written; the
tokenizer and other non-weight files travel along. transformers loads the `hf` output.
"""

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

from absl import app, flags

from mocheg_jax.models import zoo
from mocheg_jax.utils.cli import friendly_errors

_FROM = flags.DEFINE_string("from", None, "Source checkpoint folder.", required=True)
_TO = flags.DEFINE_string("to", None, "Target folder.", required=True)
_FORMAT = flags.DEFINE_enum("format", "orbax", ["orbax", "hf"], "Target format.")


@friendly_errors
def main(argv):
  del argv
  zoo.convert_folder(_FROM.value, _TO.value, _FORMAT.value)
  print(f"{zoo.model_type(_TO.value)} checkpoint written to {_TO.value} ({_FORMAT.value})")


if __name__ == "__main__":
  app.run(main)
