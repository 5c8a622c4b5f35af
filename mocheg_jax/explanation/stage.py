"""The explanation stage of the main job: the truthfulness classifier, two generators, Table 5.

After verification, on the world the main job prepared:
1. trains the truthfulness classifier (configs/classifier.py:<scale>) in
   WORKDIR/stages/explain_classifier and scores it on the test split's gold explanations
   (the paper reports 87.59% F1 for its BERT classifier);
2. trains the generator (configs/explain.py:<scale>) twice: on the NLL alone
   (WORKDIR/stages/explain_nll) and with the REINFORCE term rewarded by that classifier
   (WORKDIR/stages/explain_reinforce);
3. generates test explanations with each (beam search, the config's decoding settings) in
   Table 5's four settings: gold or system evidence (WORKDIR/runs/retrieval_results.csv) x
   gold or system labels (WORKDIR/runs/verify_results.csv, the verification stage's chosen
   verifier on system evidence), and scores them beside LEAD-3, ORACLE and the evidence
   itself: ROUGE-1/2/L, BLEU, BERTScore on the main job's text retriever's
   token states, and per generator row the classifier's agreement with the label the
   generator was asked to argue for (what the REINFORCE term is meant to raise).
Writes WORKDIR/table5.md and table5.json and the generated texts under
WORKDIR/runs/explanations/. Finished trainings are reused on a rerun.
"""

from __future__ import annotations

import csv
import os
import shutil
import time
from typing import Callable, Sequence

import jax
import ml_collections
import numpy as np
from flax import nnx

from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.tokenizers import load_tokenizer
from mocheg_jax.explanation import classifier_task
from mocheg_jax.explanation import inputs as inputs_lib
from mocheg_jax.explanation import table5
from mocheg_jax.models import encoding
from mocheg_jax.parallel import distributed
from mocheg_jax.train import evaluations, loop
from mocheg_jax.train.checkpoint import Checkpointer
from mocheg_jax.train.restore import load_trained
from mocheg_jax.train.writer import METRICS_FILE
from mocheg_jax.utils import configs, files, resident_memory
from mocheg_jax.verification import stage as verification_stage

SPLIT = "test"
CLASSIFIER_DIR = "explain_classifier"
RETRIEVER_DIR = "retrieval_text"  # Its BERT's token states are BERTScore's embeddings.
# Table 5's generators: (stage folder, rewarded). The NLL generator's row is its best dev
# ROUGE-L checkpoint; the rewarded one's is its last, so that the row is always a model the
# reward term trained (its best ROUGE-L may be the checkpoint before the term started).
GENERATORS = {"BART": ("explain_nll", False), "BART + REINFORCE": ("explain_reinforce", True)}
RETRIEVAL_RESULTS = os.path.join("runs", "retrieval_results.csv")
VERIFY_RESULTS = verification_stage.VERIFY_RESULTS  # What the verification stage writes.
EXPLANATIONS_DIR = os.path.join("runs", "explanations")
BERT_SCORE_MAX_LEN = 256  # Tokens per text for BERTScore (longer texts keep their start).
# What the evaluation writes (relative to WORKDIR): a rerun reuses it while these are intact.
OUTPUTS = (EXPLANATIONS_DIR, table5.TABLE_JSON, table5.TABLE_MD)

# The main job's tiny run is a plumbing check inside a test budget: fewer steps than
# configs/*.py:tiny (which are for a standalone run) and one evaluation, at the end; the
# reward term still switches on for the last steps.
TINY_STEPS = {"classifier": 40, "generator": 30, "sc_start_step": 20}
# The small run: configs/explain.py:small's reward term starts at step 800, so 800 NLL steps
# then 150 with it. At 400 NLL steps the generator could not yet state a claim's names and
# the term did not help.
SMALL_STEPS = {"generator": 950}


# ---- configs ----------------------------------------------------------------------------------
def classifier_config(scale: str, workdir: str, seed: int, *, release: str = "",
                      overrides: configs.Overrides | None = None
                      ) -> ml_collections.ConfigDict:
  """configs/classifier.py:<scale> on the main job's world, then `overrides`."""
  config = configs.stage_config("classifier", scale, workdir, seed, release=release)
  if scale == "tiny":
    config.total_steps = config.checkpoint_every = TINY_STEPS["classifier"]
    config.eval_every = 0  # At the end only.
  return configs.apply_overrides(config, "classifier", overrides)


def generator_config(scale: str, workdir: str, seed: int, classifier_dir: str = "", *,
                     release: str = "", overrides: configs.Overrides | None = None
                     ) -> ml_collections.ConfigDict:
  """configs/explain.py:<scale> on the main job's world, then `overrides`; with
  `classifier_dir` the reward term is on."""
  config = configs.stage_config("explain", scale, workdir, seed, release=release)
  config.explain.classifier = classifier_dir
  if scale == "tiny":
    config.total_steps = TINY_STEPS["generator"]
    config.eval_every = 0  # At the end only.
    # A checkpoint where the reward term starts: the rewarded generator starts from it.
    config.checkpoint_every = config.explain.sc_start_step = TINY_STEPS["sc_start_step"]
  elif scale == "small":
    # configs/explain.py:small's 1,500 steps (700 with the reward term) take over four hours
    # on 2 CPU cores; the main job stops at 950 (NLL ~6.5 s a step, with the term ~15 s).
    config.total_steps = SMALL_STEPS["generator"]
    # A checkpoint at the reward's start step: the rewarded generator starts from it.
    config.eval_every = config.checkpoint_every = config.explain.sc_start_step // 2
  return configs.apply_overrides(config, "explain", overrides)


# ---- generation -------------------------------------------------------------------------------
def generate(trained, claims: Sequence, batch_size: int | None = None) -> list[str]:
  """Beam-searched explanations of `claims` (generator_task.Explainer), in order.

  Args:
    trained: a generator's `restore.Trained`.
    claims: `Claim`s whose `label` and `evidence` are what the generator reads.
    batch_size: sources per decoding batch (None: the config's explain.eval_batch_size).
  """
  if not claims:
    return []
  explainer = trained.task.inference
  if batch_size:
    config = ml_collections.ConfigDict(explainer.config.to_dict())
    config.explain.eval_batch_size = int(batch_size)
    explainer = type(explainer)(config, explainer.tokenizer_dir)
  texts, _, _ = explainer.generate(trained.model, list(claims))
  return texts


def write_explanations(path: str, claim_ids: Sequence[int], texts: Sequence[str]) -> None:
  """`claim_id,explanation` rows, written beside `path` and renamed (never half a file)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with files.atomic_open(path, newline="") as f:
    writer = csv.writer(f)
    writer.writerow(("claim_id", "explanation"))
    writer.writerows(zip(claim_ids, texts))


# ---- BERTScore on our encoder -----------------------------------------------------------------
def token_embedder(retriever_dir: str, max_length: int = BERT_SCORE_MAX_LEN
                   ) -> table5.TokenEmbedder:
  """BERTScore's embedder on a trained text retriever's BERT (see `bert_token_embedder`)."""
  trained = load_trained(retriever_dir, "best")
  encoder = getattr(trained.model, "encoder", None)
  tokenizer_dir = getattr(trained.task.inference, "tokenizer_dir", None)
  if encoder is None or tokenizer_dir is None:
    raise MochegInputError(f"{retriever_dir}: its task ({trained.config.task}) is not a text "
                           "retriever")
  return bert_token_embedder(encoder.bert, load_tokenizer(tokenizer_dir), max_length)


def bert_token_embedder(model, tokenizer, max_length: int = BERT_SCORE_MAX_LEN
                        ) -> table5.TokenEmbedder:
  """texts -> the last hidden states [T_i, D] of a `bert.BertModel` without [CLS] and
  [SEP], as BERTScore matches them. Each distinct text is encoded once (the references
  recur in every row of the table); texts longer than `max_length` keep their start."""
  max_length = min(max_length, model.config.max_position_embeddings)
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, ids, mask):
    hidden, _ = nnx.merge(graphdef, state)(ids, mask, deterministic=True)
    return hidden  # [B, L, D]

  cache: dict[str, np.ndarray] = {}

  def embed(texts: list[str]) -> list[np.ndarray]:
    new = list(dict.fromkeys(t for t in texts if t not in cache))
    if new:
      def sink(rows, states, lengths):
        states = np.asarray(states, np.float32)
        for row, hidden, n in zip(rows, states, lengths):
          cache[new[row]] = hidden[1:int(n) - 1]  # Without [CLS] and [SEP].
      encoding.run_text_encoder(lambda ids, mask: forward(state, ids, mask), tokenizer, new,
                                width=model.config.hidden_size, max_length=max_length,
                                sink=sink)
    return [cache[t] for t in texts]

  return embed


# ---- the stage --------------------------------------------------------------------------------
def agreement(probabilities: np.ndarray, labels: Sequence[int]) -> float | None:
  """The share of texts the classifier assigns `labels` (None without texts)."""
  if not len(labels):
    return None
  return float(np.mean(probabilities.argmax(-1) == np.asarray(labels)))


def _pct(value: float | None) -> str:
  return "-" if value is None else f"{100 * value:.2f}"


def format_agreement(rows: Sequence[dict], classifier: dict) -> str:
  """The classifier's test scores and its agreement with each generator row's labels."""
  lines = [f"\nTruthfulness classifier on the {SPLIT} split's gold explanations: macro F1 "
           f"{100 * classifier['macro_f1']:.2f}, micro F1 {100 * classifier['micro_f1']:.2f} "
           f"({classifier['claims']} claims; the paper's BERT classifier: 87.59).",
           "\nClassifier agreement on generated explanations (share assigned the label the "
           "generator was given / the gold label):"]
  for r in rows:
    if "classifier_agreement" in r:
      lines.append(f"- {r['system']}, evidence {r['evidence']}, label {r['label']}: "
                   f"{_pct(r['classifier_agreement'])} / "
                   f"{_pct(r['classifier_agreement_gold'])} "
                   f"({r['distinct_texts']} distinct texts)")
  return "\n".join(lines)


def run(workdir: str, scale: str, seed: int = 0, log: Callable[[str], None] = print, *,
        release: str = "", overrides: configs.Overrides | None = None) -> dict:
  """Runs the stage on `release` (default: the synthetic world in WORKDIR/release) with
  configs/classifier.py and configs/explain.py at `scale`, then `overrides`; returns
  {"rows": Table 5 rows, "table": markdown, "classifier": its test scores, "timings_s" and
  "peak_resident_gb": per training}."""
  inputs = dict(release=release, overrides=overrides)
  reader = MochegRelease(configs.release_dir(workdir, release))
  stages = os.path.join(workdir, "stages")
  system_evidence = os.path.join(workdir, RETRIEVAL_RESULTS)
  system_labels = os.path.join(workdir, VERIFY_RESULTS)
  for path, who in ((system_evidence, "retrieval"), (system_labels, "verification")):
    if not os.path.isfile(path):
      raise MochegInputError(f"{path}: missing; the {who} stage writes it (run the main job's "
                             "earlier stages first)")
  timings: dict[str, float] = {}
  peaks: dict[str, float] = {}  # Peak resident memory, GiB: the stage's trainings share a process.

  def train(name: str, config: ml_collections.ConfigDict, where: str) -> None:
    log(f"training {name} in {where}")
    start = time.perf_counter()
    with resident_memory.PeakWindow() as memory:
      loop.train_stage(config, where, log=log)
    timings[name] = round(time.perf_counter() - start, 2)
    peaks[name] = memory.peak_gb

  classifier_dir = os.path.join(stages, CLASSIFIER_DIR)
  train("classifier", classifier_config(scale, workdir, seed, **inputs), classifier_dir)
  nll = None  # (stage folder, config) of the NLL generator, trained first.
  for folder, rewarded in GENERATORS.values():
    config = generator_config(scale, workdir, seed, classifier_dir if rewarded else "",
                              **inputs)
    where = os.path.join(stages, folder)
    if not rewarded:
      nll = (where, config)
    elif nll:
      distributed.primary_only("reinforce_start",
                               lambda: start_from_nll_run(*nll, where, config, log))
    train(folder, config, where)

  def evaluate() -> dict:
    retriever = os.path.join(stages, RETRIEVER_DIR)
    folders = [classifier_dir, *(os.path.join(stages, f) for f, _ in GENERATORS.values())]
    inputs = {"trained": [evaluations.trained(d) for d in folders],
              "bert_score": (evaluations.trained(retriever) if _has_checkpoints(retriever)
                             else None),
              "system_evidence": evaluations.file(system_evidence),
              "system_labels": evaluations.file(system_labels), "release": reader.root,
              "release_files": evaluations.folder_sizes(reader.root), "split": SPLIT}
    out = evaluations.reuse(workdir, "explanation", inputs, OUTPUTS, lambda: _evaluate(
        workdir, reader, classifier_dir, system_evidence, system_labels, log), log)
    log(f"\nTable 5 ({SPLIT} split, synthetic world):\n" + out["table"])
    return out

  # The trainings above are collective; generating and scoring is process 0's alone.
  out = distributed.primary_only("explanation_stage", evaluate)
  log("explanation trainings: " + ", ".join(
      f"{k} {timings[k]} s (peak resident {peaks[k]} GiB)" for k in timings))
  return {**out, "timings_s": timings, "peak_resident_gb": peaks}


def start_from_nll_run(nll_dir: str, nll_config: ml_collections.ConfigDict,
                       rl_dir: str, rl_config: ml_collections.ConfigDict,
                       log: Callable[[str], None] = print) -> bool:
  """Gives the rewarded generator the NLL generator's checkpoint at the reward's start step.

  Before `explain.sc_start_step` the two trainings are the same computation (same seed,
  data order and updates: the term's weight is 0 and its sampling key is read without
  advancing the dropout stream; tests/test_explanation_stage.py compares the curves), so the
  rewarded one resumes there instead of training those steps again: on the small world 800
  of its 950 steps (~90 minutes on 2 CPU cores). Copies the checkpoint and the metrics
  (the resumed run drops the records after it); TensorBoard's events before it are not
  copied. Does nothing (False) when the rewarded run has checkpoints already, the configs
  differ in more than the classifier, or the NLL run kept no checkpoint at that step.
  """
  start = rl_config.explain.sc_start_step
  target = os.path.join(rl_dir, loop.CHECKPOINT_DIR)
  source = os.path.join(nll_dir, loop.CHECKPOINT_DIR, str(start))
  unrewarded = ml_collections.ConfigDict(rl_config.to_dict())
  unrewarded.explain.classifier = nll_config.explain.classifier
  if (not start or os.path.isdir(target) and os.listdir(target)
      or unrewarded.to_dict() != nll_config.to_dict()
      or start not in _checkpoint_steps(nll_dir)):
    return False
  os.makedirs(target, exist_ok=True)
  shutil.copytree(source, os.path.join(target, str(start)))
  metrics = os.path.join(nll_dir, METRICS_FILE)
  if os.path.isfile(metrics):
    shutil.copyfile(metrics, os.path.join(rl_dir, METRICS_FILE))
  log(f"{rl_dir}: starts from {source} (the NLL generator at step {start}, where the reward "
      "term starts)")
  return True


def _checkpoint_steps(stage_dir: str) -> list[int]:
  if not _has_checkpoints(stage_dir):
    return []
  with Checkpointer(os.path.join(stage_dir, loop.CHECKPOINT_DIR), read_only=True) as saved:
    return saved.all_steps()


def _has_checkpoints(stage_dir: str) -> bool:
  return os.path.isdir(os.path.join(stage_dir, loop.CHECKPOINT_DIR))


def _evaluate(workdir: str, reader: MochegRelease, classifier_dir: str,
              system_evidence: str, system_labels: str,
              log: Callable[[str], None]) -> dict:
  """Generates with both trained generators in the four settings, scores them and the
  baselines, and writes Table 5."""
  stages = os.path.join(workdir, "stages")
  classifier = classifier_task.load_classifier(classifier_dir)
  gold = classifier_task.read_explanations(reader, SPLIT)
  classifier_scores = {"claims": len(gold.labels), "step": classifier.step,
                       **classifier_task.scores(gold.labels, classifier.predict(gold.texts))}
  log(f"truthfulness classifier ({SPLIT}, {len(gold.labels)} gold explanations): macro F1 "
      f"{classifier_scores['macro_f1']:.4f}")

  settings = {(e, l): inputs_lib.build_inputs(
      reader, SPLIT, labels=inputs_lib.GOLD if l == "gold" else system_labels,
      evidence=inputs_lib.GOLD if e == "gold" else system_evidence)
              for e in ("gold", "system") for l in ("gold", "system")}
  for (e, l), x in settings.items():
    log(f"explanation inputs, {e} evidence x {l} labels: {x.summary()}")
  references = {c.claim_id: c.explanation for c in reader.claims(SPLIT)}
  retriever = os.path.join(stages, RETRIEVER_DIR)
  if _has_checkpoints(retriever):
    embed = token_embedder(retriever)
  else:  # Not a failure: the table is complete without it.
    embed = None
    log(f"no trained text retriever in {retriever}: Table 5 without BERTScore")
  out_dir = os.path.join(workdir, EXPLANATIONS_DIR)

  rows = []
  for system, (folder, rewarded) in GENERATORS.items():
    trained = load_trained(os.path.join(stages, folder), "latest" if rewarded else "best")
    tokenizer = trained.task.inference.tokenizer
    for (e, l), x in settings.items():
      start = time.perf_counter()
      texts = generate(trained, x.claims)
      ids = [c.claim_id for c in x.claims]
      write_explanations(os.path.join(out_dir, f"{folder}-{e}_evidence-{l}_labels.csv"), ids,
                         texts)
      row = table5.score_row(system, e, l, dict(zip(ids, texts)), references,
                             bert_encoder=embed)
      probabilities = classifier.predict(texts)
      row.update(distinct_texts=len(set(texts)),  # 1 when the source is ignored.
                 classifier_agreement=agreement(probabilities, x.intended_labels),
                 classifier_agreement_gold=agreement(probabilities, x.gold_labels),
                 truncated_sources=inputs_lib.count_truncated(
                     tokenizer, x.claims, trained.config.explain.max_source_len),
                 **{f"inputs/{k}": v for k, v in x.counts().items()},
                 generation_s=round(time.perf_counter() - start, 2))
      rows.append(row)
      log(f"{system}, {e} evidence, {l} labels: ROUGE-L {100 * row['rougeL']:.2f}, "
          f"classifier agreement {_pct(row['classifier_agreement'])}")
  rows.extend(table5.baseline_rows(reader.claims(SPLIT), evidence="gold",
                                   bert_encoder=embed))
  system_claims = settings[("system", "gold")].claims  # Retrieved sentences as evidence.
  rows.extend(table5.baseline_rows(system_claims, evidence="system", bert_encoder=embed))

  table5.write_table(rows, workdir)
  markdown = table5.format_table(rows) + "\n" + format_agreement(rows, classifier_scores)
  files.write_text(os.path.join(workdir, table5.TABLE_MD), markdown + "\n")
  return {"rows": rows, "table": markdown, "classifier": classifier_scores}
