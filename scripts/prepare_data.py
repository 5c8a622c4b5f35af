"""Builds the `mocheg` TFDS dataset (array_record) from a release folder.

  python scripts/prepare_data.py --release=DIR --data_dir=DIR [--configs=claims,kb_sentences]

Works the same on the real release and on a synthetic world. Records that cannot be used
are listed in `skipped.csv` beside each config's data and summarised on the console.
"""

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

from absl import app, flags

from mocheg_jax.data import tfds_mocheg
from mocheg_jax.utils.cli import friendly_errors

_RELEASE = flags.DEFINE_string("release", None, "Mocheg release root folder.", required=True)
_DATA_DIR = flags.DEFINE_string("data_dir", None, "TFDS data dir to write.", required=True)
_CONFIGS = flags.DEFINE_list("configs", list(tfds_mocheg.FEATURES), "Configs to build.")


@friendly_errors
def main(argv):
  del argv
  unknown = sorted(set(_CONFIGS.value) - set(tfds_mocheg.FEATURES))
  if unknown:
    raise app.UsageError(f"unknown config(s) {unknown}; expected {list(tfds_mocheg.FEATURES)}")
  prepared = tfds_mocheg.build(_RELEASE.value, _DATA_DIR.value, tuple(_CONFIGS.value))
  for name, p in prepared.items():
    sizes = ", ".join(f"{split}={info.num_examples:,}"
                      for split, info in p.builder.info.splits.items())
    print(f"{name}: {sizes} -> {p.builder.data_dir}")
    print(f"  {p.skipped or 'reused prepared data'} "
          f"(list: {tfds_mocheg.skipped_report_path(p.builder)})")


if __name__ == "__main__":
  app.run(main)
