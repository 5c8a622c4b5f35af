"""The README's main job, end to end on the tiny world (every stage, Tables 3-5, the
pipeline folder), its resume behaviour, and the scripts run on what it trained. The job is
the session's `tiny_main_job` (tests/tiny_job.py: a few steps per training)."""

import contextlib
import json
import os
import pathlib
import shutil
import subprocess

import jax
import pytest

from mocheg_jax import workflow
from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.metrics import trec
from mocheg_jax.pipeline import manifest as manifest_lib
from mocheg_jax.retrieval.results import read_results
from tests import rerun_retrieval, tiny_job
from tests.processes import Runs, run_script

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def main_job(tiny_main_job):
  """The session's tiny main job (scripts/run_pipeline.py, a few steps per training)."""
  return tiny_main_job.workdir, tiny_main_job.summary, tiny_main_job.log


@contextlib.contextmanager
def _original_aside(workdir: pathlib.Path):
  """The folder renamed away meanwhile, so nothing can read (or write) it; back after."""
  aside = workdir.with_name(workdir.name + "-aside")
  workdir.rename(aside)
  try:
    yield
    assert not workdir.exists(), "the copy's run wrote into the original's place"
  finally:
    if workdir.exists():
      shutil.rmtree(workdir)
    aside.rename(workdir)  # Later tests use the original.


def test_main_job_runs_and_resumes_in_a_moved_folder(main_job, tmp_path):
  from mocheg_jax.retrieval.stage import fused_name, image_system_name

  workdir, summary, text = main_job
  assert "| refuted / supported / NEI |" in text and "KB: " in text
  assert set(summary["batches"]) == {"text_retrieval", "image_retrieval", "verification",
                                     "explanation"}
  assert summary["batches"]["verification"]["images"] == [4, 2, 64, 64, 3]
  assert sum(summary["splits"][s]["claims"] for s in ("train", "val", "test")) >= 90
  systems = {(r["system"], r["modality"]) for r in summary["retrieval"]}
  grounded = image_system_name(summary["retrieval_system_image"]["best_grounded"])
  choice = summary["retrieval_system_text"]
  fused = {(fused_name(w), "text") for w in (choice["weight"], choice["fused_weight"])
           if 0 < w < 1}
  assert systems == {("BM25", "text"), ("SBERT zero-shot", "text"), ("SBERT fine-tuned", "text"),
                     ("SBERT + rerank", "text"), ("CLIP fine-tuned", "image"),
                     (grounded, "image")} | fused
  assert "| SBERT + rerank | text | 5 |" in text  # Table 3 printed.
  table4 = {(r["system"], r["evidence"]) for r in summary["verification"]}
  assert table4 == {("Majority", "-"), ("Average similarity", "gold"),
                    ("Average similarity", "system"), ("Stance (none)", "-")} | {
                        (f"Stance ({m})", e) for m in ("text+image", "text", "image",
                                                        "text+image, system-trained",
                                                        "text+image, 2 seeds averaged")
                        for e in ("gold", "system")}
  assert all(r["claims"] == summary["splits"]["test"]["claims"]
             for r in summary["verification"])
  assert "| Stance (text+image) | gold |" in text  # Table 4 printed.
  results = read_results(workdir / "runs" / "retrieval_results.csv")
  assert len(results) == sum(summary["splits"][s]["claims"] for s in ("train", "val", "test"))
  assert all(len(r.text_ids) == 10 and len(r.images) == 10 for r in results.values())
  on_disk = json.load(open(workdir / "summary.json"))
  assert on_disk["batches"] == summary["batches"]
  # Every step's peak resident memory beside its time, the explanation stage's trainings too.
  assert set(on_disk["peak_resident_gb"]) == set(on_disk["timings_s"]) >= {
      "retrieval", "explanation", "explanation.explain_reinforce"}
  assert all(gb > 0.1 for gb in on_disk["peak_resident_gb"].values())
  # A second run reuses every finished step (the world is not rewritten), here in a copy of
  # the folder made elsewhere (a job moved off a cluster): the paths the first run recorded
  # (saved configs, mining cache, index headers, feature stores) are read as the copy's.
  copy = tmp_path / "elsewhere" / "workdir"
  shutil.copytree(workdir, copy, symlinks=True)
  stamp = os.path.getmtime(copy / "release" / "Corpus3.csv")
  lines = []
  with _original_aside(workdir), jax.default_matmul_precision(tiny_job.PRECISION):
    workflow.run("tiny", str(copy), seed=0, log=lines.append, overrides=tiny_job.OVERRIDES)
    assert manifest_lib.read_manifest(str(copy)).moved == (str(workdir), str(copy))
  assert any(f"was written at {workdir}" in line for line in lines)
  assert sum("finished before" in line for line in lines) == 13  # Every training.
  assert any("reused from" in line for line in lines)
  # So is every evaluation (Tables 3-5), and the tables are the first run's.
  assert sum("evaluation reused from" in line for line in lines) == 3
  rerun = json.loads((copy / "summary.json").read_text())
  for table in ("retrieval", "verification", "explanation"):
    assert rerun[table] == summary[table]
  assert os.path.getmtime(copy / "release" / "Corpus3.csv") == stamp


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
  return run_script(REPO / "scripts" / name, *args, timeout_s=600)  # One CPU device.


def _fails_with(proc: subprocess.CompletedProcess, message: str) -> None:
  assert proc.returncode == 1, (proc.stdout, proc.stderr)
  assert "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr


def test_search_and_index_scripts(main_job, tmp_path):
  from mocheg_jax.retrieval import grounding

  workdir, _, _ = main_job
  stages, index = workdir / "stages", workdir / "index"
  text, image, rerank = (f"--checkpoint={stages / s}" for s in ("retrieval_text",
                                                                 "retrieval_image", "rerank"))
  # The main job's text index, searched and reranked from the command line.
  run, results = tmp_path / "text.run", tmp_path / "results.csv"
  proc = _script("search.py", f"--index={index / 'text'}", text, "--split=test", "--top_k=3",
                 f"--run={run}", f"--results={results}", f"--rerank_checkpoint={stages / 'rerank'}",
                 "--candidates=20")
  assert proc.returncode == 0, proc.stderr
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert report["reranked"] and report["kind"] == "text"
  ranked = trec.read_run(run)
  assert len(ranked) == report["claims"] and all(len(r) == 3 for r in ranked.values())
  rows = read_results(results)
  claim = next(iter(rows.values()))
  assert list(claim.text_ids) == [d for d, _ in ranked[str(claim.claim_id)]]
  # The image index searched with that run as the text evidence to ground on: the images of
  # the articles of each claim's best 2 text hits come first (scored above 1), and only they.
  image_run = tmp_path / "image.run"
  proc = _script("search.py", f"--index={index / 'image'}", image, "--split=test",
                 "--top_k=4", f"--run={image_run}", f"--text_run={run}", "--articles=2")
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout.strip().splitlines()[-1])["grounded_articles"] == 2
  grounded = 0
  for claim, images in trec.read_run(image_run).items():
    articles = grounding.hit_articles(ranked[claim], 2)
    for name, score in images:
      assert (score > 1) == (grounding.image_article(name) in articles), (claim, name)
      grounded += score > 1
  assert grounded > 0

  # Bad input: another encoder's index, a reranker on images, a missing shard, and an index
  # that does not hold the release's KB; grounding a text search.
  _fails_with(_script("search.py", f"--index={index / 'text'}", text, f"--run={run}",
                      f"--text_run={run}"),
              "grounding on text evidence ranks images, but the index holds texts")
  _fails_with(_script("search.py", f"--index={index / 'text'}", image, f"--run={run}"),
              "the index was built by another encoder")
  _fails_with(_script("search.py", f"--index={index / 'text'}", text, f"--run={run}",
                      f"--rerank_checkpoint={stages / 'rerank'}", "--rerank_weight=1.5"),
              "--rerank_weight=1.5: 1.5 is not a number in the range [0.0, 1.0]")
  _fails_with(_script("search.py", f"--index={index / 'image'}", image, rerank.replace(
      "--checkpoint", "--rerank_checkpoint"), f"--run={run}"),
              "a reranker reorders text evidence, but the index holds images")
  _fails_with(_script("index.py", image, f"--out={index / 'text'}"),
              "the index there was started with kind='text' (this run: 'image')")
  broken = tmp_path / "broken"
  shutil.copytree(index / "text", broken)
  (broken / "shard-00000.npy").unlink()
  _fails_with(_script("search.py", f"--index={broken}", text, f"--run={run}"),
              f"{broken / 'shard-00000.npy'}: missing shard")
  other = tmp_path / "other_release"
  shutil.copytree(workdir / "release", other, ignore=shutil.ignore_patterns("images"))
  sentences = other / "supplementary" / "Corpus3_sentence_level.csv"
  kept = sentences.read_text().splitlines(keepends=True)  # One sentence per line.
  sentences.write_text("".join(kept[:len(kept) // 2]))
  _fails_with(_script("search.py", f"--index={index / 'text'}", text, f"--release={other}",
                      f"--run={run}"),
              "the index does not match the text KB of")


@pytest.fixture(scope="module")
def rerun(main_job) -> dict:
  """tests/rerun_retrieval.py's runs on the main job, searched in the job's environment:
  {"text": {"reranked" | "dense" | "system": {split: run}}, "candidates": {"first" |
  "reranked": {dev split: run}}, "images": {N: run}}, a run {claim id: [(doc id, score)]
  best first}."""
  root = main_job[0].parent
  out, logs = root / "rerun.json", root / "rerun_logs"
  logs.mkdir(exist_ok=True)
  runs = Runs(logs, tiny_job.TIMEOUT_S)
  runs.start("rerun", "tests/rerun_retrieval.py", [str(main_job[0]), str(out)],
             tiny_job.job_environment(root))
  runs.wait()
  found = json.loads(out.read_text())

  def tuples(run):
    return {claim: [(d, s) for d, s in ranked] for claim, ranked in run.items()}

  return {key: {name: {split: tuples(run) for split, run in splits.items()}
                for name, splits in found[key].items()} for key in ("text", "candidates")} | {
          "images": {int(n): tuples(run) for n, run in found["images"].items()}}


def _claims(workdir: pathlib.Path, split: str) -> list[str]:
  return [str(c.claim_id) for c in MochegRelease(workdir / "release").claims(split)]


def _assert_same_run(run: dict, expected: dict) -> None:
  assert sorted(run) == sorted(expected)
  for claim, ranked in run.items():
    assert [d for d, _ in ranked] == [d for d, _ in expected[claim]]
    assert [s for _, s in ranked] == pytest.approx([s for _, s in expected[claim]], abs=1e-4)


def test_system_evidence_and_labels_are_the_ones_chosen_on_dev(main_job, rerun):
  """The result CSV's text columns (system evidence of Tables 4 and 5), for the test, dev
  and train claims, are the bi-encoder's and the reranker's scores fused with the weight
  `choose_text_system` chose from the dev claims' lists; the system labels come from the verifier
  `choose_system_verifier` picked on the dev claims' system evidence (one of them trained on
  the train claims' rows); the manifest tells the fact-checker both."""
  from mocheg_jax.retrieval import stage as retrieval_stage
  from mocheg_jax.train.restore import load_trained
  from mocheg_jax.verification import stage as verification_stage

  workdir, summary, text = main_job
  choice = summary["retrieval_system_text"]
  dev = {split: runs[retrieval_stage.DEV_SPLIT] for split, runs in rerun["candidates"].items()}
  assert choice == retrieval_stage.choose_text_system(
      dev["first"], dev["reranked"],
      MochegRelease(workdir / "release").text_qrels(retrieval_stage.DEV_SPLIT))
  assert all(isinstance(v, float) for v in choice["dev"].values())
  manifest = manifest_lib.read_manifest(str(workdir))
  assert manifest.settings.rerank_weight == choice["weight"]
  assert f"system text evidence: {retrieval_stage.describe_choice(choice)}" in text
  expected = {claim: ranked for run in rerun["text"]["system"].values()
              for claim, ranked in run.items()}
  csv_rows = read_results(workdir / "runs" / "retrieval_results.csv")
  _assert_same_run({str(c): list(zip(r.text_ids, r.text_scores)) for c, r in csv_rows.items()},
                   expected)
  assert all(len(r.images) == 10 for r in csv_rows.values())
  # Its image columns: the ranking chosen on dev among the global CLIP one and those
  # grounded on the system text evidence (the CSV's own text columns).
  image_choice = summary["retrieval_system_image"]
  assert manifest.settings.image_articles == image_choice["articles"]
  assert f"system image evidence: {retrieval_stage.describe_choice(image_choice)}" in text
  expected_images = rerun["images"]
  assert image_choice == retrieval_stage.choose_image_system(
      {n: {c: expected_images[n][c] for c in _claims(workdir, "val")} for n in expected_images},
      MochegRelease(workdir / "release").image_qrels("val"))
  _assert_same_run({str(c): list(zip(r.images, r.image_scores)) for c, r in csv_rows.items()},
                   expected_images[image_choice["articles"]])

  labels = summary["system_labels"]
  trained = {m: load_trained(str(workdir / verification_stage.stage_folder(m)))
             for m in verification_stage.SYSTEM_LABEL_MODES}
  assert labels == verification_stage.choose_system_verifier(
      trained, str(workdir / "runs" / "retrieval_results.csv"))
  assert {m: t.config.verify.evidence for m, t in trained.items()} == {
      "text+image": "gold", "text": "gold",
      verification_stage.SYSTEM_TRAINED: str(workdir / "runs" / "retrieval_results.csv")}
  assert manifest.stages["verifier"] == str(workdir / labels["stage"])


def test_fact_checker_reproduces_the_main_jobs_system_rows(main_job, rerun):
  """The pipeline folder checks the test claims exactly as the stages scored them: the
  system text evidence (reranked or not, as the manifest says), the image run, the system
  labels (the chosen verifier on system evidence) and the NLL generator's explanations
  with system evidence and labels. With another fusion weight, the text evidence is that
  weight's ranking."""
  import csv
  import dataclasses

  from mocheg_jax.pipeline.fact_checker import FactChecker
  from mocheg_jax.verification.predictions import read_predictions

  workdir, summary, text = main_job
  assert len(summary["fact_checks"]) == workflow.SAMPLE_CLAIMS
  assert '"explanation": ' in text  # The sample checks' JSON is printed.
  claims = MochegRelease(workdir / "release").claims("test")
  manifest = manifest_lib.read_manifest(str(workdir))
  checker = FactChecker.load(str(workdir))
  weight = manifest.settings.rerank_weight
  other_weight = 0.0 if 0 < weight < 1 else 0.5  # The other path: a mix, or no reranking.
  other = FactChecker(dataclasses.replace(manifest, settings=dataclasses.replace(
      manifest.settings, rerank_weight=other_weight)))
  # The job ran at the precision it was given and its folder says so; a folder recording
  # bfloat16 products has its claims checked under that setting, whatever this process's
  # (the tiny models are too narrow to round: models/matmul.py, so the setting is watched).
  assert summary["matmul_precision"] == manifest.settings.matmul_precision == tiny_job.PRECISION
  rounded = FactChecker(dataclasses.replace(manifest, settings=dataclasses.replace(
      manifest.settings, matmul_precision="bfloat16")))
  seen = []
  for step in ("_text_evidence", "_verify", "_explain"):
    def watched(*args, _step=getattr(rounded, step)):
      seen.append(jax.config.jax_default_matmul_precision)
      return _step(*args)
    setattr(rounded, step, watched)
  try:
    results = checker.check_many([c.claim for c in claims])
    rounded_result = rounded.check(claims[0].claim)
    with_image = checker.check(claims[0].claim, image=str(
        workdir / "release" / "images" / sorted(os.listdir(workdir / "release" / "images"))[0]))
    other_texts = [r.text_evidence for r in other.check_many([c.claim for c in claims[:4]])]
  finally:
    checker.close()
    other.close()
    rounded.close()
  assert seen == ["bfloat16"] * 3 and jax.config.jax_default_matmul_precision is None
  assert rounded_result.claim == claims[0].claim
  _assert_same_run(trec.read_run(workdir / "runs" / "text.run"),
                   rerun["text"]["reranked"]["test"])
  # The checkers ran in this process: compared with this process's searches.
  runs = {w: rerun_retrieval.text_runs(str(workdir), ["test"], w)["test"]
          for w in (weight, other_weight)}
  text_run = runs[weight]
  # Images likewise (the job's own image run, from 2 devices, is checked against a re-search
  # in its environment above; near-tied images may swap between device layouts).
  articles = manifest.settings.image_articles
  image_run = rerun_retrieval.image_runs(str(workdir), ["test"], text_run, [articles])[articles]
  for claim, evidence in zip(claims, other_texts):
    assert [(e.id, pytest.approx(e.score, abs=1e-4)) for e in evidence] == \
        runs[other_weight][str(claim.claim_id)]
  labels = read_predictions(workdir / "runs" / "verify_results.csv")
  with open(workdir / "runs" / "explanations" /
            "explain_nll-system_evidence-system_labels.csv") as f:
    explanations = {int(r["claim_id"]): r["explanation"] for r in csv.DictReader(f)}
  for claim, result in zip(claims, results, strict=True):
    key = str(claim.claim_id)
    assert [(e.id, pytest.approx(e.score, abs=1e-4)) for e in result.text_evidence] == \
        text_run[key]
    assert [e.file for e in result.image_evidence] == [d for d, _ in image_run[key]]
    expected = labels[claim.claim_id]
    assert result.label == ("refuted", "supported", "NEI")[expected.label]
    assert list(result.probabilities.values()) == pytest.approx(expected.probabilities,
                                                                abs=1e-5)
    assert result.explanation == explanations[claim.claim_id]
  # The main job's own sample checks (a batch of 3, not of the whole split: scores agree to
  # float rounding; a fused text score standardises the cosines, whose spread over a claim's
  # candidates is small, so their rounding grows in it).
  sample, first = summary["fact_checks"][0], results[0].to_json()
  for key in ("claim", "label", "explanation"):
    assert sample[key] == first[key]
  for key, tolerance in (("text_evidence", 1e-4), ("image_evidence", 1e-5)):
    assert [e["score"] for e in sample[key]] == pytest.approx(
        [e["score"] for e in first[key]], abs=tolerance)
    assert [{**e, "score": 0} for e in sample[key]] == [{**e, "score": 0} for e in first[key]]
  # A claim's own image comes first among its image evidence, scored by the same CLIP.
  assert with_image.image_evidence[0].file.startswith(str(workdir))
  assert [e.file for e in with_image.image_evidence[1:]] == \
      [e.file for e in results[0].image_evidence]
  assert -1.0 <= with_image.image_evidence[0].score <= 1.0


def test_a_moved_pipeline_folder_checks_claims_alike(main_job, tmp_path):
  """Trained on a cluster, copied elsewhere, the original removed: the copy checks claims
  exactly as the original did (its saved configs, index and feature-store fingerprints name
  the original folder, and are read as naming the copy)."""
  from mocheg_jax.pipeline.fact_checker import FactChecker

  workdir, _, _ = main_job
  claims = [c.claim for c in MochegRelease(workdir / "release").claims("test")[:3]]
  image = sorted(os.listdir(workdir / "release" / "images"))[0]

  def check(folder: pathlib.Path):
    checker = FactChecker.load(str(folder))
    try:
      return (checker.check_many(claims),
              checker.check(claims[0], image=str(folder / "release" / "images" / image)))
    finally:
      checker.close()

  original, original_with_image = check(workdir)
  copy = tmp_path / "elsewhere" / "pipeline"
  shutil.copytree(workdir, copy, symlinks=True)
  with _original_aside(workdir):
    moved, moved_with_image = check(copy)
  for a, b in zip(original + [original_with_image], moved + [moved_with_image], strict=True):
    assert b.claim == a.claim
    assert [e.id for e in b.text_evidence] == [e.id for e in a.text_evidence]
    assert [e.score for e in b.text_evidence] == pytest.approx(
        [e.score for e in a.text_evidence], abs=1e-5)
    assert b.label == a.label
    assert list(b.probabilities.values()) == pytest.approx(list(a.probabilities.values()),
                                                           abs=1e-5)
    assert b.explanation == a.explanation
  for a, b in zip(original, moved):
    assert [e.file for e in b.image_evidence] == [e.file for e in a.image_evidence]
  # The claim's own image: the copy's file, scored as the original's.
  assert moved_with_image.image_evidence[0].file == str(copy / "release" / "images" / image)
  assert [e.score for e in moved_with_image.image_evidence] == pytest.approx(
      [e.score for e in original_with_image.image_evidence], abs=1e-5)
  assert [e.file for e in moved_with_image.image_evidence[1:]] == \
      [e.file for e in original_with_image.image_evidence[1:]]


def test_fact_check_script(main_job, tmp_path):
  workdir, _, _ = main_job
  pipeline = f"--pipeline={workdir}"
  image = workdir / "release" / "images" / sorted(os.listdir(workdir / "release" / "images"))[0]
  requests = tmp_path / "claims.jsonl"
  requests.write_text(json.dumps({"claim": "Port Varn mainly exports tin."}) + "\n" +
                      json.dumps({"claim": "The flag of Varn is red.", "image": str(image)})
                      + "\n")
  out = tmp_path / "out.jsonl"
  proc = _script("fact_check.py", pipeline, f"--input={requests}", f"--output={out}")
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout == ""  # Logs go to stderr; the results to the file.
  results = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["claim"] for r in results] == ["Port Varn mainly exports tin.",
                                           "The flag of Varn is red."]
  for r in results:
    assert set(r) == {"claim", "text_evidence", "image_evidence", "label", "probabilities",
                      "explanation"}
    assert r["label"] in ("refuted", "supported", "NEI")
    assert sum(r["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
    assert all(set(e) == {"id", "text", "score"} for e in r["text_evidence"])
  assert results[1]["image_evidence"][0]["file"] == str(image)

  # Bad input: nothing on stdout, no output file, one error line naming the culprit.
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"claim": "fine"}) + "\n" + json.dumps({"claim": "  "}) + "\n")
  out.unlink()
  proc = _script("fact_check.py", pipeline, f"--input={bad}", f"--output={out}")
  _fails_with(proc, f"{bad}:2: empty")
  assert proc.stdout == "" and not out.exists()
  not_image = tmp_path / "photo.png"
  not_image.write_text("not a picture")
  proc = _script("fact_check.py", pipeline, "--claim=The flag of Varn is red.",
                 f"--image={not_image}")
  _fails_with(proc, f"cannot read image {str(not_image)!r}: not an image format")
  assert proc.stdout == ""
  broken = tmp_path / "pipeline"
  broken.mkdir()
  manifest = json.loads((workdir / "manifest.json").read_text())
  for part in ("release", "index", "stages"):
    (broken / part).symlink_to(workdir / part)
  manifest["stages"]["verifier"] = "stages/verify_missing"
  (broken / "manifest.json").write_text(json.dumps(manifest))
  proc = _script("fact_check.py", f"--pipeline={broken}", "--claim=The flag of Varn is red.")
  _fails_with(proc, "stage 'verifier' ")
  assert proc.stdout == ""
